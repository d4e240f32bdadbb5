package gateway

import (
	"fmt"
	"maps"
	"slices"
	"testing"
)

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
