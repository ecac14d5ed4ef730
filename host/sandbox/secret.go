package sandbox

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
)

// GeneratePassword returns a random password for one start: 32 bytes from
// crypto/rand, base64url without padding (43 printable characters).
func GeneratePassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate the daemon password: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// WriteSecret creates path exclusively, 0600, and writes s to it. O_EXCL
// also refuses a symlink (dangling or not) at path.
func WriteSecret(path, s string) error { return writeSecret(path, s) }

// ReplaceSecret puts s at path in place of what a WriteSecret of the
// same caller left there (or of nothing): a new 0600 file in path's
// directory, created exclusively under a random name, renamed over path.
// A reader sees the old content or the new one, whole, never a mix; a
// symlink at path is replaced, not followed.
func ReplaceSecret(path, s string) error {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	f, err := os.CreateTemp(dir, "."+base+".*")
	if err != nil {
		return fmt.Errorf("password file: %w", err)
	}
	tmp := f.Name()
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("password file: %w", err)
	}
	return nil
}

func writeSecret(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("password file: %w (give a path that does not exist yet)", err)
	}
	if _, err := f.WriteString(s); err != nil {
		f.Close()
		os.Remove(path)
		return fmt.Errorf("password file: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(path)
		return fmt.Errorf("password file: %w", err)
	}
	return nil
}
