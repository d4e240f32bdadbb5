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
