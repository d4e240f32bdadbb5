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

// Platforms are the platforms on which a user has a connection that
// counts, and in what state: for each platform a live bit (web 1, desktop
// 2, mobile 4) for an open connection, an active bit (the live bit
// shifted by activeShift) when one of those is not idle, and a background
// bit (shifted by backgroundShift) for a connection whose app went to the
// background (open, or closed and living out its background grace). Its
// JSON is an object from platform to "active", "idle" or "background",
// the first that applies, in the order web, desktop, mobile:
// {"web":"active","mobile":"background"}. The zero value is no platform.
type Platforms uint16

const (
	activeShift     = 3
	backgroundShift = 6
)

// The states a platform's entry names.
const (
	platformActive     = "active"
	platformIdle       = "idle"
	platformBackground = "background"
)

// with returns ps with a connection on p added: open or not (a
// background connection living out its grace), active or idle, in the
// background or not.
func (ps Platforms) with(p Platform, open, active, background bool) Platforms {
	bit := platformBit(p)
	if open && !background {
		ps |= bit
		if active {
			ps |= bit << activeShift
		}
	}
	if background {
		ps |= bit << backgroundShift
	}
	return ps
}

// State returns "active", "idle" or "background" for a platform the user
// has a connection on that counts, and "" for one they have none on.
func (ps Platforms) State(p Platform) string {
	bit := platformBit(p)
	switch {
	case bit == 0:
		return ""
	case ps&(bit<<activeShift) != 0:
		return platformActive
	case ps&bit != 0:
		return platformIdle
	case ps&(bit<<backgroundShift) != 0:
		return platformBackground
	}
	return ""
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
		case platformActive, platformIdle, platformBackground:
			bg := state == platformBackground
			out = out.with(Platform(name), !bg, state == platformActive, bg)
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
