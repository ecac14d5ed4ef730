package imagebuild

import (
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// OCI media types and the layout version this package writes and reads.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayerGz  = "application/vnd.oci.image.layer.v1.tar+gzip"
	LayoutVersion     = "1.0.0"
	RefNameAnnotation = "org.opencontainers.image.ref.name"
	CreatedAnnotation = "org.opencontainers.image.created"
)

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Platform    *Platform         `json:"platform,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// Platform is a descriptor's platform.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Index is index.json.
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// ImageManifest is an image manifest.
type ImageManifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        Descriptor        `json:"config"`
	Layers        []Descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// ImageConfig is an image configuration (the fields this builder sets).
type ImageConfig struct {
	Created      string         `json:"created"`
	Architecture string         `json:"architecture"`
	OS           string         `json:"os"`
	Config       RuntimeConfig  `json:"config"`
	RootFS       RootFS         `json:"rootfs"`
	History      []HistoryEntry `json:"history"`
}

// RuntimeConfig is the config's execution defaults.
type RuntimeConfig struct {
	Env        []string `json:"Env,omitempty"`
	Entrypoint []string `json:"Entrypoint,omitempty"`
	WorkingDir string   `json:"WorkingDir,omitempty"`
}

// RootFS lists the uncompressed layer digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// HistoryEntry is one history record.
type HistoryEntry struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// ociLayer is a written gzip layer.
type ociLayer struct {
	path           string // the .tar.gz file
	digest, diffID string // sha256:...
	size           int64
}

// WriteOCILayout writes an OCI image layout at dir (which must not
// exist): oci-layout, index.json naming one manifest (tagged ref), the
// manifest, a config and the given gzip layer, all under
// blobs/sha256. The JSON is written in a fixed order with no build-time
// values but epoch, so the same layer gives the same layout.
func writeOCILayout(dir string, layer ociLayer, arch, ref string, epoch time.Time) error {
	blobs := filepath.Join(dir, "blobs", "sha256")
	if err := os.MkdirAll(blobs, 0o755); err != nil {
		return err
	}
	putBlob := func(b []byte) (string, error) {
		s := sha256.Sum256(b)
		h := hex.EncodeToString(s[:])
		return "sha256:" + h, os.WriteFile(filepath.Join(blobs, h), b, 0o644)
	}
	if err := copyFile(layer.path, filepath.Join(blobs, strings.TrimPrefix(layer.digest, "sha256:"))); err != nil {
		return err
	}
	created := epoch.UTC().Format(time.RFC3339)
	cfg := ImageConfig{
		Created: created, Architecture: arch, OS: "linux",
		Config: RuntimeConfig{
			Env:        []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
			Entrypoint: []string{AgentPath},
			WorkingDir: "/",
		},
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{layer.diffID}},
		History: []HistoryEntry{{Created: created, CreatedBy: "oac-image build"}},
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	cd, err := putBlob(cb)
	if err != nil {
		return err
	}
	man := ImageManifest{
		SchemaVersion: 2, MediaType: MediaTypeManifest,
		Config:      Descriptor{MediaType: MediaTypeConfig, Digest: cd, Size: int64(len(cb))},
		Layers:      []Descriptor{{MediaType: MediaTypeLayerGz, Digest: layer.digest, Size: layer.size}},
		Annotations: map[string]string{CreatedAnnotation: created},
	}
	mb, err := json.Marshal(man)
	if err != nil {
		return err
	}
	md, err := putBlob(mb)
	if err != nil {
		return err
	}
	idx := Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{{
		MediaType: MediaTypeManifest, Digest: md, Size: int64(len(mb)),
		Platform:    &Platform{Architecture: arch, OS: "linux"},
		Annotations: map[string]string{RefNameAnnotation: ref},
	}}}
	ib, err := json.Marshal(idx)
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "index.json"), ib, 0o644); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion":"`+LayoutVersion+`"}`), 0o644)
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// LayoutImage is what ReadOCILayout found.
type LayoutImage struct {
	Ref          string
	Architecture string
	OS           string
	Entrypoint   []string
	// Layers are the layer digests; Entries counts the members of all
	// layers.
	Layers  []string
	Entries int
}

var digestRE = regexp.MustCompile(`^sha256:[0-9a-f]{64}$`)

// maxJSONBlob bounds the JSON documents of a layout.
const maxJSONBlob = 4 << 20

// ErrLayout is wrapped by every error of ReadOCILayout.
var ErrLayout = errors.New("invalid OCI layout")

func layoutErr(format string, a ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrLayout}, a...)...)
}

// ParseIndex decodes index.json (strictly: unknown fields refused).
func ParseIndex(b []byte) (*Index, error) {
	var idx Index
	if err := strictJSON(b, &idx); err != nil {
		return nil, layoutErr("index.json: %v", err)
	}
	if idx.SchemaVersion != 2 {
		return nil, layoutErr("index.json: schemaVersion %d (want 2)", idx.SchemaVersion)
	}
	if idx.MediaType != "" && idx.MediaType != MediaTypeIndex {
		return nil, layoutErr("index.json: mediaType %q", idx.MediaType)
	}
	if len(idx.Manifests) == 0 {
		return nil, layoutErr("index.json lists no manifest")
	}
	for _, d := range idx.Manifests {
		if err := checkDescriptor(d, MediaTypeManifest); err != nil {
			return nil, err
		}
	}
	return &idx, nil
}

// ParseManifest decodes an image manifest strictly.
func ParseManifest(b []byte) (*ImageManifest, error) {
	var m ImageManifest
	if err := strictJSON(b, &m); err != nil {
		return nil, layoutErr("manifest: %v", err)
	}
	if m.SchemaVersion != 2 || m.MediaType != MediaTypeManifest {
		return nil, layoutErr("manifest: want schemaVersion 2 and mediaType %s", MediaTypeManifest)
	}
	if err := checkDescriptor(m.Config, MediaTypeConfig); err != nil {
		return nil, err
	}
	if len(m.Layers) == 0 {
		return nil, layoutErr("manifest lists no layer")
	}
	for _, l := range m.Layers {
		if err := checkDescriptor(l, MediaTypeLayerGz); err != nil {
			return nil, err
		}
	}
	return &m, nil
}

func checkDescriptor(d Descriptor, mediaType string) error {
	if d.MediaType != mediaType {
		return layoutErr("descriptor has mediaType %q, want %s", d.MediaType, mediaType)
	}
	if !digestRE.MatchString(d.Digest) {
		return layoutErr("descriptor digest is not sha256:<64 hex>")
	}
	if d.Size < 0 || d.Size > 64<<30 {
		return layoutErr("descriptor size %d out of range", d.Size)
	}
	return nil
}

func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return errors.New("trailing data")
	}
	return nil
}

// ReadOCILayout reads the layout at dir back and checks it all: the
// oci-layout version, index.json, the manifest, config and layers, each
// blob's size and digest, and each layer's uncompressed digest against
// the config's diff_ids (every layer is read as a tar to its end).
func ReadOCILayout(dir string) (*LayoutImage, error) {
	lb, err := os.ReadFile(filepath.Join(dir, "oci-layout"))
	if err != nil {
		return nil, layoutErr("%v", err)
	}
	var lay struct {
		ImageLayoutVersion string `json:"imageLayoutVersion"`
	}
	if err := strictJSON(lb, &lay); err != nil || lay.ImageLayoutVersion != LayoutVersion {
		return nil, layoutErr("oci-layout: want imageLayoutVersion %s", LayoutVersion)
	}
	ib, err := readLimited(filepath.Join(dir, "index.json"), maxJSONBlob)
	if err != nil {
		return nil, err
	}
	idx, err := ParseIndex(ib)
	if err != nil {
		return nil, err
	}
	if len(idx.Manifests) != 1 {
		return nil, layoutErr("index.json lists %d manifests; this reader takes one image", len(idx.Manifests))
	}
	md := idx.Manifests[0]
	mb, err := readBlob(dir, md, maxJSONBlob)
	if err != nil {
		return nil, err
	}
	man, err := ParseManifest(mb)
	if err != nil {
		return nil, err
	}
	cb, err := readBlob(dir, man.Config, maxJSONBlob)
	if err != nil {
		return nil, err
	}
	var cfg ImageConfig
	if err := strictJSON(cb, &cfg); err != nil {
		return nil, layoutErr("config: %v", err)
	}
	if cfg.RootFS.Type != "layers" || len(cfg.RootFS.DiffIDs) != len(man.Layers) {
		return nil, layoutErr("config: rootfs lists %d diff_ids for %d layers", len(cfg.RootFS.DiffIDs), len(man.Layers))
	}
	img := &LayoutImage{Architecture: cfg.Architecture, OS: cfg.OS, Entrypoint: cfg.Config.Entrypoint}
	if md.Annotations != nil {
		img.Ref = md.Annotations[RefNameAnnotation]
	}
	if md.Platform != nil && (md.Platform.Architecture != cfg.Architecture || md.Platform.OS != cfg.OS) {
		return nil, layoutErr("index platform %s/%s differs from the config's %s/%s", md.Platform.OS, md.Platform.Architecture, cfg.OS, cfg.Architecture)
	}
	for i, l := range man.Layers {
		n, diffID, err := readLayer(dir, l)
		if err != nil {
			return nil, err
		}
		if diffID != cfg.RootFS.DiffIDs[i] {
			return nil, layoutErr("layer %d: uncompressed digest %s, the config says %s", i, diffID, cfg.RootFS.DiffIDs[i])
		}
		img.Layers = append(img.Layers, l.Digest)
		img.Entries += n
	}
	return img, nil
}

func readLimited(p string, limit int64) ([]byte, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, layoutErr("%v", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, layoutErr("%v", err)
	}
	if int64(len(b)) > limit {
		return nil, layoutErr("%s is larger than %d bytes", filepath.Base(p), limit)
	}
	return b, nil
}

func blobPath(dir string, d Descriptor) string {
	return filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d.Digest, "sha256:"))
}

func readBlob(dir string, d Descriptor, limit int64) ([]byte, error) {
	if d.Size > limit {
		return nil, layoutErr("blob %s is larger than %d bytes", d.Digest, limit)
	}
	b, err := readLimited(blobPath(dir, d), limit)
	if err != nil {
		return nil, err
	}
	if int64(len(b)) != d.Size {
		return nil, layoutErr("blob %s is %d bytes, the descriptor says %d", d.Digest, len(b), d.Size)
	}
	s := sha256.Sum256(b)
	if "sha256:"+hex.EncodeToString(s[:]) != d.Digest {
		return nil, layoutErr("blob %s does not match its digest", d.Digest)
	}
	return b, nil
}

// readLayer checks a gzip layer blob's size and digest, reads it as a tar
// to its end, and returns its member count and uncompressed digest.
func readLayer(dir string, d Descriptor) (int, string, error) {
	f, err := os.Open(blobPath(dir, d))
	if err != nil {
		return 0, "", layoutErr("%v", err)
	}
	defer f.Close()
	outer := sha256.New()
	cr := &countingReader{r: io.TeeReader(f, outer)}
	zr, err := gzip.NewReader(cr)
	if err != nil {
		return 0, "", layoutErr("layer %s: %v", d.Digest, err)
	}
	inner := sha256.New()
	t, err := ReadTar(io.TeeReader(zr, inner), discardSink, TarLimits{})
	if err != nil {
		return 0, "", layoutErr("layer %s: %v", d.Digest, err)
	}
	// The tar reader stops at the end-of-archive marker: hash the rest.
	if _, err := io.Copy(inner, zr); err != nil {
		return 0, "", layoutErr("layer %s: %v", d.Digest, err)
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return 0, "", layoutErr("layer %s: %v", d.Digest, err)
	}
	if cr.n != d.Size {
		return 0, "", layoutErr("layer %s is %d bytes, the descriptor says %d", d.Digest, cr.n, d.Size)
	}
	if "sha256:"+hex.EncodeToString(outer.Sum(nil)) != d.Digest {
		return 0, "", layoutErr("layer %s does not match its digest", d.Digest)
	}
	return t.Len() - 1, "sha256:" + hex.EncodeToString(inner.Sum(nil)), nil
}

func discardSink(_ int, r io.Reader) (string, []byte, error) {
	_, err := io.Copy(io.Discard, r)
	return "(discarded)", nil, err
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
