package gateway

import "time"

// deadlines holds things due at a time, earliest first. It is not safe for
// concurrent use.
type deadlines[T comparable] struct {
	items []deadline[T]
}

type deadline[T comparable] struct {
	at time.Time
	v  T
}

// add has v due at at.
func (d *deadlines[T]) add(at time.Time, v T) {
	d.items = append(d.items, deadline[T]{at, v})
	for i := len(d.items) - 1; i > 0 && d.items[i].at.Before(d.items[i-1].at); i-- {
		d.items[i], d.items[i-1] = d.items[i-1], d.items[i]
	}
}

// due removes and returns what is due by now.
func (d *deadlines[T]) due(now time.Time) []T {
	n := 0
	for n < len(d.items) && !d.items[n].at.After(now) {
		n++
	}
	if n == 0 {
		return nil
	}
	out := make([]T, n)
	for i := range n {
		out[i] = d.items[i].v
	}
	d.items = append(d.items[:0], d.items[n:]...)
	return out
}

// last returns when the latest thing is due; zero when there is none.
func (d *deadlines[T]) last() time.Time {
	if len(d.items) == 0 {
		return time.Time{}
	}
	return d.items[len(d.items)-1].at
}

// all removes and returns everything.
func (d *deadlines[T]) all() []T {
	out := make([]T, len(d.items))
	for i, it := range d.items {
		out[i] = it.v
	}
	d.items = d.items[:0]
	return out
}

// len returns how many things are held.
func (d *deadlines[T]) len() int { return len(d.items) }
