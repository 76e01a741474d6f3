// Package version holds the build's version, set at link time by the Makefile.
package version

// Version is the bare package version that `iii --version` prints.
var Version = "0.26.0"
