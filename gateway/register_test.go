package gateway

import "testing"

// TestListedLocked: a write's self event is handed over in process only
// when every connection of the user here is in the registry; one still
// being registered would miss it, and gets it from NATS instead.
func TestListedLocked(t *testing.T) {
	listed := &conn{key: connKey{listed: true}}
	registering := &conn{}
	for _, tt := range []struct {
		name  string
		conns []*conn
		want  bool
	}{
		{"none", nil, true},
		{"all listed", []*conn{listed, listed}, true},
		{"one registering", []*conn{listed, registering}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := listedLocked(&userState{conns: tt.conns}); got != tt.want {
				t.Errorf("got %v, want %v", got, tt.want)
			}
		})
	}
}
