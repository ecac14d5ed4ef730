package initramfs

import (
	"bytes"
	"debug/elf"
	"fmt"
	"io"
	"os"
)

// Architectures of VM guests.
const (
	ArchAMD64 = "amd64"
	ArchARM64 = "arm64"
)

// KernelArch tells an x86 bzImage (amd64) from an arm64 Image by their
// boot headers: "HdrS" at 0x202 for x86, "ARM\x64" at 0x38 for arm64.
func KernelArch(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("kernel: %w", err)
	}
	defer f.Close()
	b := make([]byte, 0x206)
	if _, err := io.ReadFull(f, b); err != nil {
		return "", fmt.Errorf("kernel %s: too short to be a kernel image", path)
	}
	switch {
	case bytes.Equal(b[0x38:0x3c], []byte("ARM\x64")):
		return ArchARM64, nil
	case bytes.Equal(b[0x202:0x206], []byte("HdrS")):
		return ArchAMD64, nil
	}
	return "", fmt.Errorf("kernel %s: neither an x86 bzImage nor an arm64 Image (an arm64 kernel must be uncompressed)", path)
}

// BinaryArch returns the architecture of an ELF executable (amd64, arm64
// or the ELF machine's name), or "" when path is not an ELF file.
func BinaryArch(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	magic := make([]byte, 4)
	if _, err := io.ReadFull(f, magic); err != nil || !bytes.Equal(magic, []byte(elf.ELFMAG)) {
		return "", nil
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	switch ef.Machine {
	case elf.EM_X86_64:
		return ArchAMD64, nil
	case elf.EM_AARCH64:
		return ArchARM64, nil
	}
	return ef.Machine.String(), nil
}
