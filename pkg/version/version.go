package version

import (
	"regexp"
	"runtime/debug"
	"strings"
)

// stamp is the version a build sets with -ldflags "-X
// github.com/greendot/greendot/pkg/version.stamp=1.2.3"; empty means
// the build information's.
var stamp string

// devel is the version of a build that knows none.
const devel = "0.0.0-devel"

// String returns the version of this build as semantic versioning: the
// stamped version, else the main module's version, without a leading v.
// A version that is not semantic versioning keeps what it can as a
// pre-release of 0.0.0 ("(devel)" is 0.0.0-devel). It is safe for
// concurrent use.
func String() string {
	v := stamp
	if v == "" {
		if bi, ok := debug.ReadBuildInfo(); ok {
			v = bi.Main.Version
		}
	}
	return semver(v)
}

// semverRE is the regular expression semver.org suggests, the one NATS
// micro checks service versions with.
var semverRE = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)` +
	`(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?` +
	`(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`)

// semver returns v as semantic versioning: a Go module version (v1.2.3, a
// pseudo-version, +incompatible, +dirty) without its v; anything else as a
// pre-release of 0.0.0 made of its letters, digits, dots and dashes; and
// devel when nothing is left.
func semver(v string) string {
	v = strings.TrimPrefix(strings.TrimSpace(v), "v")
	if semverRE.MatchString(v) {
		return v
	}
	pre := strings.Map(func(r rune) rune {
		switch {
		case r >= '0' && r <= '9', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r == '.':
			return r
		}
		return '-'
	}, v)
	pre = strings.Trim(pre, ".-")
	if s := "0.0.0-" + pre; pre != "" && semverRE.MatchString(s) {
		return s
	}
	return devel
}
