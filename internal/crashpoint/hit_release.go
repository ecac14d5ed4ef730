//go:build !crashpoints || !unix

package crashpoint

// Enabled is whether this build can crash at a point.
const Enabled = false

// Hit does nothing in a release build.
func Hit(Point) {}

// Armed is false in a release build.
func Armed(Point) bool { return false }
