// Package imagecli is oac-image's command line: it parses flags and calls
// packages imagebuild, initramfs, manifest and stage. It sits above them:
// only cmd/oac-image imports it, and none of them imports it, so the image
// tool's imports run one way (imagecli -> imagebuild -> initramfs,
// manifest). It owns nothing else. Every command but build runs on
// Linux, macOS and Windows; build, whose outputs carry Unix owners and
// device nodes, is compiled out on Windows and says so (help.go).
package imagecli
