package kit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// ImageRecord says which image file a kept sandbox was created from (its
// path, size, time and SHA-256), so a later start can tell that the file
// changed since.
type ImageRecord struct {
	Source  string `json:"source"`
	Size    int64  `json:"size"`
	ModTime int64  `json:"mod_time_unix_nano"`
	SHA256  string `json:"sha256"`
}

// maxImageRecord bounds the record read back.
const maxImageRecord = 64 << 10

// RecordImage reads image whole and returns its record.
func RecordImage(image string) (ImageRecord, error) {
	abs, err := filepath.Abs(image)
	if err != nil {
		return ImageRecord{}, err
	}
	st, err := os.Stat(abs)
	if err != nil {
		return ImageRecord{}, err
	}
	sum, err := fileDigest(abs)
	if err != nil {
		return ImageRecord{}, err
	}
	return ImageRecord{Source: abs, Size: st.Size(), ModTime: st.ModTime().UnixNano(), SHA256: sum}, nil
}

// Changed compares image with the record: the same path, size and time
// are the same image, otherwise the content's digest decides. It returns
// "" for the same image, else a sentence saying that the sandbox keeps
// what it made of the old one (kept) until reset.
func (r ImageRecord) Changed(image, kept string) string {
	abs, _ := filepath.Abs(image)
	st, err := os.Stat(abs)
	if err != nil {
		return fmt.Sprintf("the image %s cannot be read (%v); the sandbox keeps %s of %s until reset", image, err, kept, r.Source)
	}
	if abs == r.Source && st.Size() == r.Size && st.ModTime().UnixNano() == r.ModTime {
		return ""
	}
	sum, err := fileDigest(abs)
	if err != nil {
		return fmt.Sprintf("the image %s cannot be read (%v); the sandbox keeps %s of %s until reset", image, err, kept, r.Source)
	}
	if sum == r.SHA256 {
		return ""
	}
	return fmt.Sprintf("the image %s (sha256 %s) is not the one this sandbox was created from (%s, sha256 %s): it keeps %s of the old one until reset",
		image, shortSum(sum), r.Source, shortSum(r.SHA256), kept)
}

func shortSum(s string) string {
	if len(s) > 12 {
		return s[:12]
	}
	return s
}

func fileDigest(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// WriteImageRecord writes r to path whole or not at all (a temporary
// file, path+".part", renamed into place).
func WriteImageRecord(path string, r ImageRecord) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp := path + ".part"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("kept sandbox: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("kept sandbox: %w", err)
	}
	return nil
}

// ReadImageRecord reads a record WriteImageRecord wrote; a missing file
// is an error wrapping os.ErrNotExist.
func ReadImageRecord(path string) (ImageRecord, error) {
	var r ImageRecord
	f, err := os.Open(path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxImageRecord))
	if err != nil {
		return r, fmt.Errorf("kept image record: %w", err)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("kept image record %s is damaged (%v): reset the sandbox", path, err)
	}
	return r, nil
}
