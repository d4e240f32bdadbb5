package gateway

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

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

// TestUserStates: the states walked are those of the users known, as
// users are added and forgotten in any order.
func TestUserStates(t *testing.T) {
	r := &registrar{users: make(map[string]*userState)}
	for i := range 20 {
		r.lockUser(fmt.Sprint("u", i)).mu.Unlock()
	}
	for _, i := range []int{19, 0, 18, 7, 8, 13, 1} {
		r.forget(r.users[fmt.Sprint("u", i)])
	}
	r.lockUser("u0").mu.Unlock()
	r.lockUser("u20").mu.Unlock()
	var got []string
	for _, us := range r.userStates() {
		got = append(got, us.id)
	}
	want := slices.Collect(maps.Keys(r.users))
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) || len(want) != 15 {
		t.Errorf("walked %v, want %v", got, want)
	}
}
