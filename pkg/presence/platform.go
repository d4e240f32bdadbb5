package presence

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// Platform is the kind of device a connection is on, as its client said
// at connect (`?platform=`): one of Platforms' names, or empty when the
// client did not say.
type Platform string

// The platforms a client may name, in the order Platforms lists them.
const (
	PlatformWeb     Platform = "web"
	PlatformDesktop Platform = "desktop"
	PlatformMobile  Platform = "mobile"
)

var platforms = [...]Platform{PlatformWeb, PlatformDesktop, PlatformMobile}

// ValidPlatform reports whether s names a platform.
func ValidPlatform(s string) bool { return platformBit(Platform(s)) != 0 }

// platformBit returns p's bit in Platforms' live half; 0 for no platform.
func platformBit(p Platform) Platforms {
	for i, q := range platforms {
		if p == q {
			return 1 << i
		}
	}
	return 0
}

// Platforms are the platforms on which a user has a live connection, and
// on which of them one of those is active (not idle): for each platform
// a live bit (web 1, desktop 2, mobile 4) and an active bit (the live bit
// shifted by activeShift). Its JSON is an object from platform to
// "active" or "idle", in the order web, desktop, mobile:
// {"web":"active","mobile":"idle"}. The zero value is no platform.
type Platforms uint8

const activeShift = 3

// The states a platform's entry names.
const (
	platformActive = "active"
	platformIdle   = "idle"
)

// with returns ps with a live connection on p added, active or idle.
func (ps Platforms) with(p Platform, active bool) Platforms {
	bit := platformBit(p)
	ps |= bit
	if active {
		ps |= bit << activeShift
	}
	return ps
}

// State returns "active" or "idle" for a platform the user is live on,
// and "" for one they are not.
func (ps Platforms) State(p Platform) string {
	bit := platformBit(p)
	switch {
	case bit == 0 || ps&bit == 0:
		return ""
	case ps&(bit<<activeShift) != 0:
		return platformActive
	}
	return platformIdle
}

// AppendJSON appends the JSON object of ps to dst.
func (ps Platforms) AppendJSON(dst []byte) []byte {
	dst = append(dst, '{')
	first := true
	for _, p := range platforms {
		state := ps.State(p)
		if state == "" {
			continue
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, '"')
		dst = append(dst, p...)
		dst = append(dst, `":"`...)
		dst = append(dst, state...)
		dst = append(dst, '"')
	}
	return append(dst, '}')
}

// MarshalJSON writes ps as AppendJSON does.
func (ps Platforms) MarshalJSON() ([]byte, error) { return ps.AppendJSON(nil), nil }

// UnmarshalJSON reads the object MarshalJSON writes (null as no
// platform), refusing an unknown platform or state.
func (ps *Platforms) UnmarshalJSON(data []byte) error {
	if bytes.Equal(data, []byte("null")) {
		*ps = 0
		return nil
	}
	var m map[string]string
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("platforms: %w", err)
	}
	var out Platforms
	for name, state := range m {
		if !ValidPlatform(name) {
			return fmt.Errorf("platforms: unknown platform %q", name)
		}
		switch state {
		case platformActive, platformIdle:
			out = out.with(Platform(name), state == platformActive)
		default:
			return fmt.Errorf("platforms: platform %q: unknown state %q", name, state)
		}
	}
	*ps = out
	return nil
}

// PlatformCode is a Platform in one byte, for those that keep many: 0 for
// none, else the platform's place in the list, from 1.
type PlatformCode uint8

// Code returns p's code; 0 for "" or an unknown platform.
func (p Platform) Code() PlatformCode {
	for i, q := range platforms {
		if p == q {
			return PlatformCode(i + 1)
		}
	}
	return 0
}

// Platform returns the platform of c; "" for 0.
func (c PlatformCode) Platform() Platform {
	if c == 0 || int(c) > len(platforms) {
		return ""
	}
	return platforms[c-1]
}
