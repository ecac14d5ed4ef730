module github.com/oac/sandbox-agent

go 1.26.8

require (
	github.com/Code-Hex/vz/v3 v3.7.1
	github.com/coreos/go-systemd/v22 v22.7.0
	github.com/google/nftables v0.3.0
	github.com/hashicorp/yamux v0.1.2
	github.com/klauspost/compress v1.20.4
	github.com/mdlayher/netlink v1.7.3-0.20250113171957-fbb4dce95f42
	github.com/mdlayher/vsock v1.4.0
	github.com/moby/profiles/seccomp v0.3.0
	github.com/moby/sys/mountinfo v0.7.3
	github.com/opencontainers/runtime-spec v1.3.0
	github.com/santhosh-tekuri/jsonschema/v6 v6.0.3
	github.com/stretchr/testify v1.12.1
	github.com/ulikunitz/xz v0.5.17
	go.uber.org/goleak v1.3.0
	golang.org/x/net v0.62.0
	golang.org/x/sync v0.24.0
	golang.org/x/sys v0.50.0
	golang.org/x/time v0.16.0
)

require (
	github.com/Code-Hex/go-infinity-channel v1.0.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/mdlayher/socket v0.8.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/mod v0.41.0 // indirect
	golang.org/x/text v0.43.0 // indirect
)
