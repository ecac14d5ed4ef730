package sandbox

import (
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"os"
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

// writeSecret creates path exclusively, 0600, and writes s to it. O_EXCL
// also refuses a symlink (dangling or not) at path.
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
