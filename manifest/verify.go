package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"path"
	"path/filepath"
)

// Errors of VerifyFile.
var (
	ErrMissing   = errors.New("file missing")
	ErrWrongSize = errors.New("wrong size")
	ErrDigest    = errors.New("sha256 mismatch")
)

// StorePath is where a content-addressed store keeps the file of digest
// hex: STORE/sha256/HEX.
func StorePath(store, hex string) string { return filepath.Join(store, "sha256", hex) }

// FileName is the last element of the artifact's URL path, the name it is
// looked up by in a directory.
func (a Artifact) FileName() string {
	u, err := url.Parse(a.URL)
	if err != nil {
		return ""
	}
	return path.Base(u.Path)
}

// Locate returns the first candidate file for a: the store's sha256/HEX,
// then DIR/FileName in each dir. It returns ErrMissing when none exists.
func Locate(a Artifact, store string, dirs []string) (string, error) {
	var cands []string
	if store != "" {
		cands = append(cands, StorePath(store, a.SHA256))
	}
	if name := a.FileName(); name != "" && name != "/" && name != "." {
		for _, d := range dirs {
			cands = append(cands, filepath.Join(d, name))
		}
	}
	for _, c := range cands {
		if st, err := os.Stat(c); err == nil && st.Mode().IsRegular() {
			return c, nil
		}
	}
	return "", fmt.Errorf("%w: %s (looked for %d candidate paths)", ErrMissing, a.Name, len(cands))
}

// VerifyFile checks that the file at p has a's size and sha256.
func VerifyFile(a Artifact, p string) error {
	f, err := os.Open(p)
	if err != nil {
		if os.IsNotExist(err) {
			return fmt.Errorf("%w: %s", ErrMissing, p)
		}
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	if st.Size() != a.Size {
		return fmt.Errorf("%w: %s is %d bytes, the manifest pins %d", ErrWrongSize, p, st.Size(), a.Size)
	}
	h := sha256.New()
	n, err := io.Copy(h, f)
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if n != a.Size {
		return fmt.Errorf("%w: %s changed while it was read", ErrWrongSize, p)
	}
	if got := hex.EncodeToString(h.Sum(nil)); got != a.SHA256 {
		return fmt.Errorf("%w: %s has sha256 %s, the manifest pins %s", ErrDigest, p, got, a.SHA256)
	}
	return nil
}
