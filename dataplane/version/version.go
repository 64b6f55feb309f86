// Package version holds the build's version, stamped by the Makefile with
// -ldflags "-X github.com/podnet/podnet/dataplane/version.Version=...".
package version

import "runtime/debug"

// Version is overwritten at link time; "dev" marks an unstamped build.
var Version = "dev"

// String returns the version with the Go toolchain that built it.
func String() string {
	goVersion := "unknown"
	if info, ok := debug.ReadBuildInfo(); ok {
		goVersion = info.GoVersion
	}
	return Version + " (" + goVersion + ")"
}

// Revision returns the VCS commit the binary was built from, or "unknown".
func Revision() string {
	if info, ok := debug.ReadBuildInfo(); ok {
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				return s.Value
			}
		}
	}
	return "unknown"
}
