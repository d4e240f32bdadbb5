package reaper

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
	if got.Workers != want.Workers || got.SweepInterval != want.SweepInterval || got.AckWait != want.AckWait || got.RejoinHold != want.RejoinHold {
		t.Errorf("zero config with defaults = %+v, want %+v", got, want)
	}
	if got.Logger == nil {
		t.Errorf("zero config with defaults has no logger")
	}
	if err := want.Validate(); err != nil {
		t.Errorf("DefaultConfig().Validate() = %v", err)
	}
	set := Config{Workers: 3, SweepInterval: time.Second, AckWait: time.Minute, RejoinHold: time.Second}.withDefaults()
	if set.Workers != 3 || set.SweepInterval != time.Second || set.AckWait != time.Minute || set.RejoinHold != time.Second {
		t.Errorf("set fields changed by withDefaults: %+v", set)
	}
	if none := (Config{RejoinHold: NoRejoinHold}).withDefaults(); none.RejoinHold != 0 {
		t.Errorf("NoRejoinHold with defaults = %v, want 0 (no hold)", none.RejoinHold)
	}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
	}{
		{"negative workers", Config{Workers: -1}},
		{"sweep too often", Config{SweepInterval: 10 * time.Millisecond}},
		{"negative sweep interval", Config{SweepInterval: -time.Second}},
		{"negative ack wait", Config{AckWait: -time.Second}},
		{"negative rejoin hold", Config{RejoinHold: -time.Second}},
		{"too many replicas", Config{Buckets: presence.BucketOptions{Replicas: 7}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.cfg.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("got %v, want an error wrapping ErrInvalidConfig", err)
			}
		})
	}
}
