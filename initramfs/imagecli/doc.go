// Package imagecli is oac-image's command line: it parses flags and calls
// packages initramfs, imagebuild, manifest and stage. It owns nothing
// else.
package imagecli
