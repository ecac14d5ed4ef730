package shimcli

// The providers oac-shim is built with: each registers its driver (name,
// flags, constructor) with package provider; nothing here knows their
// settings.
import (
	_ "github.com/oac/sandbox-agent/host/provider/bwrap"
	_ "github.com/oac/sandbox-agent/host/provider/docker"
	_ "github.com/oac/sandbox-agent/host/provider/kubernetes"
	_ "github.com/oac/sandbox-agent/host/provider/oci"
	_ "github.com/oac/sandbox-agent/host/provider/qemu"
	_ "github.com/oac/sandbox-agent/host/provider/vz"
	_ "github.com/oac/sandbox-agent/host/provider/wsl"
)
