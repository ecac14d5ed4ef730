//go:build !oac_doors_off

package doors

// Enabled: the agent closes the doors it finds. Only a test build turns
// it off (-tags oac_doors_off), to prove the conformance suite sees the
// doors when nothing closes them.
const Enabled = true
