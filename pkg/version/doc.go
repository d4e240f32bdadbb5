// Package version says which version of greendot runs, in one form for
// everything that reports it: greendot --version, and the version of every
// NATS micro service (greendot-gateway, greendot-reaper, greendot-fanout)
// that `nats micro ls` and the info endpoints show.
//
// The version comes from the build. A release build stamps it:
//
//	go build -ldflags "-X github.com/greendot/greendot/pkg/version.stamp=1.2.3" ./cmd/greendot
//
// as the Dockerfile does. Otherwise it is the main module's version in the
// binary's build information: its tag (v1.2.3) when built as a module
// (go install github.com/greendot/greendot/cmd/greendot@v1.2.3), a
// pseudo-version when built from a commit that has no tag, or "(devel)"
// when the build knows none.
//
// Micro requires semantic versioning, without the leading v of Go module
// versions; String gives every version in that form, "(devel)" as
// 0.0.0-devel.
package version
