package kcluster

import (
	"archive/tar"
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// ImportLayout imports an OCI image layout directory (oac-image build's
// oci/ output) into the cluster's containerd for Pods with
// imagePullPolicy: Never; the image keeps the name its index gives it
// (org.opencontainers.image.ref.name). ctr reads an archive, so the
// layout is archived first, in the cluster's directory.
func (c *Cluster) ImportLayout(ctx context.Context, layout string) error {
	archive := filepath.Join(c.Dir, "import-"+randHex(4)+".tar")
	defer os.Remove(archive)
	if err := tarTree(layout, archive); err != nil {
		return fmt.Errorf("kcluster: archive %s: %w", layout, err)
	}
	return c.ImportImage(ctx, archive)
}

// InstallSeccompProfile writes a Localhost seccomp profile where the
// kubelet looks for it (its root directory's seccomp/), as an operator
// installs one on each node.
func (c *Cluster) InstallSeccompProfile(name string, profile []byte) error {
	dir := filepath.Join(c.Dir, "kubelet", "seccomp")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, name), profile, 0o644)
}

// tarTree writes dir's files into an uncompressed tar at out.
func tarTree(dir, out string) error {
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		hdr.Name = filepath.ToSlash(rel)
		if d.IsDir() {
			hdr.Name += "/"
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !d.Type().IsRegular() {
			return nil
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	return f.Close()
}
