package gateway_test

import (
	"errors"
	"math"
	"testing"

	"github.com/greendot/greendot/gateway"
)

// TestRatesNotANumber: a rate that is NaN, which a limiter would take for
// no limit at all, is refused like a negative one.
func TestRatesNotANumber(t *testing.T) {
	t.Parallel()
	for name, set := range map[string]func(*gateway.Config){
		"RateLimit":           func(c *gateway.Config) { c.RateLimit = math.NaN() },
		"APIRateLimit":        func(c *gateway.Config) { c.APIRateLimit = math.NaN() },
		"APIAddressRateLimit": func(c *gateway.Config) { c.APIAddressRateLimit = math.NaN() },
		"SignalRate":          func(c *gateway.Config) { c.SignalRate = math.NaN() },
		"RoomUpdateRate":      func(c *gateway.Config) { c.RoomUpdateRate = math.NaN() },
	} {
		t.Run(name, func(t *testing.T) {
			var c gateway.Config
			set(&c)
			if err := c.Validate(); !errors.Is(err, gateway.ErrInvalidConfig) {
				t.Errorf("Validate() = %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// TestAllowedOrigins: an allowed origin that no browser can send (a path,
// even a trailing slash; no scheme; the default port written out) is
// refused at start rather than refusing every browser with 403.
func TestAllowedOrigins(t *testing.T) {
	t.Parallel()
	for _, o := range []string{"https://app.example.com", "http://localhost:5173", "HTTPS://App.Example.com", "*", "null"} {
		c := gateway.Config{AllowedOrigins: []string{o}}
		if err := c.Validate(); err != nil {
			t.Errorf("%q: %v, want it taken", o, err)
		}
	}
	for _, o := range []string{"https://app.example.com/", "https://app.example.com/app", "app.example.com",
		"https://app.example.com?x=1", "https://app.example.com#top", "https://app.example.com:443", "http://app.example.com:80",
		"https://user@app.example.com", "https://", "*.example.com"} {
		c := gateway.Config{AllowedOrigins: []string{o}}
		if err := c.Validate(); !errors.Is(err, gateway.ErrInvalidConfig) {
			t.Errorf("%q: Validate() = %v, want ErrInvalidConfig", o, err)
		}
	}
}
