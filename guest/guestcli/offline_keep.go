//go:build oac_keep_interfaces

package guestcli

// dropInterfaces is false in this test build: --offline deletes no
// interface (see offline_drop.go).
const dropInterfaces = false
