package version

import "testing"

func TestSemver(t *testing.T) {
	tests := []struct{ in, want string }{
		{"v1.2.3", "1.2.3"},
		{"1.2.3", "1.2.3"},
		{"0.1.0", "0.1.0"},
		{"v1.2.3-rc.1", "1.2.3-rc.1"},
		{"v0.0.0-20260123101112-0123456789ab", "0.0.0-20260123101112-0123456789ab"},
		{"v1.2.4-0.20260123101112-0123456789ab", "1.2.4-0.20260123101112-0123456789ab"},
		{"v0.0.0-20260123101112-0123456789ab+dirty", "0.0.0-20260123101112-0123456789ab+dirty"},
		{"v2.0.0+incompatible", "2.0.0+incompatible"},
		{"(devel)", devel},
		{"", devel},
		{"  ", devel},
		{"main", "0.0.0-main"},
		{"1.2", "0.0.0-1.2"},
		{"feature/x y", "0.0.0-feature-x-y"},
		{"01.2.3", devel}, // 01 is no pre-release identifier either
		{"...", devel},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got := semver(tt.in)
			if got != tt.want {
				t.Errorf("semver(%q) = %q, want %q", tt.in, got, tt.want)
			}
			if !semverRE.MatchString(got) {
				t.Errorf("semver(%q) = %q, which is not semantic versioning", tt.in, got)
			}
		})
	}
}

func TestStringPrefersTheStamp(t *testing.T) {
	defer func(s string) { stamp = s }(stamp)
	stamp = "v3.4.5"
	if got := String(); got != "3.4.5" {
		t.Errorf("String() with stamp v3.4.5 = %q, want 3.4.5", got)
	}
	stamp = ""
	if got := String(); !semverRE.MatchString(got) {
		t.Errorf("String() from the build information = %q, not semantic versioning", got)
	}
}
