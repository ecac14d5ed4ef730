package imagebuild

import (
	"errors"
	"os"
	"path/filepath"
	"time"
)

// E2BDockerfile is e2b/e2b.Dockerfile: it makes the image from the
// unpacked rootfs.tar.gz and nothing else, so the template is this build's
// image. It is fixed text: per-build values would break reproducibility
// and per-sandbox ones must not be in a snapshotted template.
const E2BDockerfile = `# E2B template for oac sandboxes, written by oac-image build --output e2b.
# Build it from this directory with E2B's CLI, e2b template build (it runs
# docker build on this file and pushes the image to E2B), or with any Docker
# engine: docker build -f e2b.Dockerfile . (then make the template from the
# pushed image). Not e2b template create: it parses the file itself, copies
# rootfs.tar.gz without unpacking it and cannot start from scratch.
# E2B runs amd64 sandboxes: build the image with oac-image build --arch amd64.
# The image is the guest image oac-image built: its base (a Debian or Ubuntu root
# for E2B's provisioning), /sbin/oac-guest (on a merged-/usr base the file is
# /usr/sbin/oac-guest, reached through the /sbin link),
# /usr/local/bin/oac-sandbox-io, the runtime user 1000 and the CA bundle.
# The helper's egress policy is /etc/oac/egress-policy.json in the image by
# default: add it with oac-image build --file SRC:/etc/oac/egress-policy.json:0644.
# No start command: Core starts the helper in each sandbox through envd's process
# API and writes the payload {runtime, sandbox_io} to its stdin:
#   /sbin/oac-guest helper
# Nothing per sandbox may be baked in: E2B snapshots the template's running state.
FROM scratch
ADD rootfs.tar.gz /
USER root
WORKDIR /
`

// writeE2B writes the E2B template build context at dir (which must not
// exist): E2BDockerfile and tarGz, the rootfs.tar.gz it unpacks.
func writeE2B(dir, tarGz string, epoch time.Time) error {
	if err := os.Mkdir(dir, 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, E2BDockerfileName), []byte(E2BDockerfile), 0o644); err != nil {
		return err
	}
	if err := linkOrCopy(tarGz, filepath.Join(dir, TarName)); err != nil {
		return err
	}
	// A linked tar output gets the epoch as its mtime too; harmless.
	return stampTimes(dir, epoch)
}

// linkOrCopy hard-links src at dst, so the bytes are written once, or
// copies them when src is on another filesystem (the work directory).
func linkOrCopy(src, dst string) error {
	err := os.Link(src, dst)
	if err == nil || errors.Is(err, os.ErrExist) {
		return err
	}
	return copyFile(src, dst)
}
