//go:build !linux

package dataplane

func probeMain() bool { return false }
