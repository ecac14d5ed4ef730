package buildinfo

// Version is the release or git description; "dev" in an unstamped build.
var Version = "dev"
