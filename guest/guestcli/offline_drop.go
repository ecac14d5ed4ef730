//go:build !oac_keep_interfaces

package guestcli

// dropInterfaces: --offline deletes the guest's interfaces but lo. Only a
// test build keeps them (-tags oac_keep_interfaces), to prove what the
// cluster's NetworkPolicy alone confines when the agent has not done its
// part; no flag, environment variable or bootstrap field turns it off.
const dropInterfaces = true
