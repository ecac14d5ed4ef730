//go:build !linux

package main

import "errors"

func reach(string) (string, error) {
	return "", errors.New("reach probes run in Linux guests only")
}
