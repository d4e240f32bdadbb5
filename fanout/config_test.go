package fanout

import (
	"errors"
	"testing"
	"time"

	"github.com/greendot/greendot/pkg/presence"
)

// TestDefaults: a zero Config means DefaultConfig, and a set field stays.
func TestDefaults(t *testing.T) {
	got := Config{}.withDefaults()
	want := DefaultConfig()
	if got.CacheSize != want.CacheSize || got.AckWait != want.AckWait || got.Logger == nil {
		t.Errorf("zero config with defaults = %+v, want %+v and a logger", got, want)
	}
	if err := want.Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
	set := Config{CacheSize: 5, AckWait: time.Minute}.withDefaults()
	if set.CacheSize != 5 || set.AckWait != time.Minute {
		t.Errorf("set fields changed by withDefaults: %+v", set)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"negative cache size", Config{CacheSize: -1}},
		{"negative ack wait", Config{AckWait: -time.Second}},
		{"bad marker TTL", Config{Buckets: presence.BucketOptions{MarkerTTL: time.Millisecond}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("got %v, want an error wrapping ErrInvalidConfig", err)
			}
		})
	}
}
