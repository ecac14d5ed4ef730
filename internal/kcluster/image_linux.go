package kcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// PauseImage is the name of the pause image Start builds and imports: the
// cluster's sandbox image, and an image a test's Pod can run
// (imagePullPolicy: Never).
const PauseImage = "oac.local/kcluster/pause:1"

// pauseSource is the pause program: it waits for SIGTERM or SIGINT, and
// reaps nothing (it is not an init for other containers' processes).
const pauseSource = `package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	c := make(chan os.Signal, 1)
	signal.Notify(c, syscall.SIGTERM, syscall.SIGINT)
	<-c
}
`

// buildPause compiles the pause program statically into dir and returns
// the binary's path.
func buildPause(ctx context.Context, dir string) (string, error) {
	src := filepath.Join(dir, "pause-src")
	if err := os.MkdirAll(src, 0o755); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "go.mod"), []byte("module pause\n\ngo 1.22\n"), 0o644); err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(src, "main.go"), []byte(pauseSource), 0o644); err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "pause")
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build the pause program: %w: %s", err, out)
	}
	return bin, nil
}

// goTool is the go command (the one of the running toolchain first).
func goTool() string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); runtime.GOROOT() != "" {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	return "go"
}

// File is one regular file of an image layer.
type File struct {
	Path string // inside the image, without a leading slash
	Mode int64
	Data []byte
}

// WriteOCIArchive writes an OCI image archive (an OCI layout in a tar) of
// one uncompressed layer holding files, whose index names it ref (in both
// the OCI ref-name annotation and containerd's image-name annotation),
// running entrypoint. It is what Cluster.ImportImage takes.
func WriteOCIArchive(path, ref string, entrypoint []string, files []File) error {
	epoch := time.Unix(0, 0).UTC()
	var layer bytes.Buffer
	tw := tar.NewWriter(&layer)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := filepath.Dir(f.Path); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	var dlist []string
	for d := range dirs {
		dlist = append(dlist, d)
	}
	// Parents first.
	sortByDepth(dlist)
	for _, d := range dlist {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
			return err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.Path, Mode: f.Mode, Size: int64(len(f.Data)), ModTime: epoch}); err != nil {
			return err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return err
	}
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
		Platform    map[string]string `json:"platform,omitempty"`
	}
	blobs := map[string][]byte{}
	put := func(mt string, b []byte) desc {
		sum := sha256.Sum256(b)
		d := "sha256:" + hex.EncodeToString(sum[:])
		blobs[d] = b
		return desc{MediaType: mt, Digest: d, Size: len(b)}
	}
	layerDesc := put("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	cfg, err := json.Marshal(map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"config":       map[string]any{"Entrypoint": entrypoint},
		"rootfs":       map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	if err != nil {
		return err
	}
	cfgDesc := put("application/vnd.oci.image.config.v1+json", cfg)
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.manifest.v1+json",
		"config":        cfgDesc,
		"layers":        []desc{layerDesc},
	})
	if err != nil {
		return err
	}
	manDesc := put("application/vnd.oci.image.manifest.v1+json", man)
	manDesc.Annotations = map[string]string{
		"org.opencontainers.image.ref.name": ref,
		"io.containerd.image.name":          ref,
	}
	manDesc.Platform = map[string]string{"architecture": runtime.GOARCH, "os": "linux"}
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     "application/vnd.oci.image.index.v1+json",
		"manifests":     []desc{manDesc},
	})
	if err != nil {
		return err
	}
	out, err := os.Create(path)
	if err != nil {
		return err
	}
	aw := tar.NewWriter(out)
	add := func(name string, b []byte) error {
		if err := aw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err := aw.Write(b)
		return err
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := aw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: epoch}); err != nil {
			out.Close()
			return err
		}
	}
	if err := add("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		out.Close()
		return err
	}
	for d, b := range blobs {
		if err := add("blobs/sha256/"+strings.TrimPrefix(d, "sha256:"), b); err != nil {
			out.Close()
			return err
		}
	}
	if err := add("index.json", index); err != nil {
		out.Close()
		return err
	}
	if err := aw.Close(); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func sortByDepth(p []string) {
	for i := 1; i < len(p); i++ {
		for j := i; j > 0 && strings.Count(p[j], "/") < strings.Count(p[j-1], "/"); j-- {
			p[j], p[j-1] = p[j-1], p[j]
		}
	}
}

// StaticBinaryImage builds the Go program in srcDir (a main package of its
// own module) statically and writes an OCI archive running it as
// /bin/<name>: a way for tests to make small images without a registry.
func StaticBinaryImage(ctx context.Context, srcDir, name, ref, archive string) error {
	bin := filepath.Join(filepath.Dir(archive), name+".bin")
	cmd := exec.CommandContext(ctx, goTool(), "build", "-trimpath", "-ldflags", "-s -w", "-o", bin, ".")
	cmd.Dir = srcDir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOWORK=off")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w: %s", srcDir, err, out)
	}
	defer os.Remove(bin)
	b, err := os.ReadFile(bin)
	if err != nil {
		return err
	}
	return WriteOCIArchive(archive, ref, []string{"/bin/" + name}, []File{{Path: "bin/" + name, Mode: 0o755, Data: b}})
}
