package gateway

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/greendot/greendot/gateway/internal/hub"
)

// registry holds every open connection: by tag (the poller's), sharded so
// that the poller, the walks of every connection and new connections
// rarely wait for each other, and by user, for self events, per-user limits, kicks and the
// authorizer. It is safe for concurrent use.
type registry struct {
	next   atomic.Uint64
	count  atomic.Int64
	shards [registryShards]registryShard

	maxPerUser int
	umu        sync.RWMutex
	users      map[string][]*conn
	// reserved counts the places held for connections being registered,
	// in all and per user (see reserve); under umu.
	reserved   int
	reservedBy map[string]int
}

const registryShards = 64

// errGatewayFull refuses a connection past --max-conns.
var errGatewayFull = fmt.Errorf("%w: the gateway is full", ErrUnavailable)

type registryShard struct {
	mu    sync.RWMutex
	conns map[uint64]*conn
}

// newRegistry returns a registry that holds at most maxPerUser connections
// of one user.
func newRegistry(maxPerUser int) *registry {
	r := &registry{maxPerUser: maxPerUser, users: make(map[string][]*conn), reservedBy: make(map[string]int)}
	for i := range r.shards {
		r.shards[i].conns = make(map[uint64]*conn)
	}
	return r
}

// reserve holds a place for a connection of user about to be
// registered, if the gateway (at most max connections; zero for no limit)
// and the user have one left, the places held counted: the limits hold
// however many upgrades come at once, each refused before its upgrade.
// add takes the place; release gives it back.
func (r *registry) reserve(user string, max int) error {
	r.umu.Lock()
	defer r.umu.Unlock()
	if max > 0 && r.len()+r.reserved >= max {
		return errGatewayFull
	}
	if len(r.users[user])+r.reservedBy[user] >= r.maxPerUser {
		return fmt.Errorf("%w: at most %d", ErrTooManyConns, r.maxPerUser)
	}
	r.reserved++
	r.reservedBy[user]++
	return nil
}

// release gives back a place reserve held for a connection of user that
// will not be added.
func (r *registry) release(user string) {
	r.umu.Lock()
	defer r.umu.Unlock()
	r.releaseLocked(user)
}

func (r *registry) releaseLocked(user string) {
	r.reserved--
	if r.reservedBy[user]--; r.reservedBy[user] <= 0 {
		delete(r.reservedBy, user)
	}
}

// add assigns c a tag and holds it, in the place reserve held for it. It
// fails with ErrTooManyConns when c's user already has as many
// connections here as allowed.
func (r *registry) add(c *conn) error {
	r.umu.Lock()
	r.releaseLocked(c.userID)
	cs := r.users[c.userID]
	if len(cs) >= r.maxPerUser {
		r.umu.Unlock()
		return ErrTooManyConns
	}
	r.users[c.userID] = append(cs, c)
	// Counted before the place is given up to another (under umu).
	r.count.Add(1)
	r.umu.Unlock()

	c.tag = r.next.Add(1)
	sh := &r.shards[c.tag%registryShards]
	sh.mu.Lock()
	sh.conns[c.tag] = c
	sh.mu.Unlock()
	return nil
}

// remove forgets c; it is a no-op for a connection not held.
func (r *registry) remove(c *conn) {
	if c.tag == 0 {
		return
	}
	sh := &r.shards[c.tag%registryShards]
	sh.mu.Lock()
	_, ok := sh.conns[c.tag]
	delete(sh.conns, c.tag)
	sh.mu.Unlock()
	if !ok {
		return
	}
	r.count.Add(-1)
	r.umu.Lock()
	defer r.umu.Unlock()
	cs := r.users[c.userID]
	for i, x := range cs {
		if x == c {
			cs[i] = cs[len(cs)-1]
			cs[len(cs)-1] = nil
			cs = cs[:len(cs)-1]
			break
		}
	}
	if len(cs) == 0 {
		delete(r.users, c.userID)
	} else {
		r.users[c.userID] = cs
	}
}

// get returns the connection with a tag, or nil.
func (r *registry) get(tag uint64) *conn {
	sh := &r.shards[tag%registryShards]
	sh.mu.RLock()
	c := sh.conns[tag]
	sh.mu.RUnlock()
	return c
}

// len returns how many connections are held.
func (r *registry) len() int { return int(r.count.Load()) }

// userConns returns the connections of a user.
func (r *registry) userConns(userID string) []*conn {
	r.umu.RLock()
	defer r.umu.RUnlock()
	return append([]*conn(nil), r.users[userID]...)
}

// userIDs returns the users with a connection here.
func (r *registry) userIDs() []string {
	r.umu.RLock()
	defer r.umu.RUnlock()
	return slices.Collect(maps.Keys(r.users))
}

// userCount returns how many users have a connection here.
func (r *registry) userCount() int {
	r.umu.RLock()
	defer r.umu.RUnlock()
	return len(r.users)
}

// watchersOf returns the connections of a user as watchers, for the
// authorizer.
func (r *registry) watchersOf(userID string) []hub.Watcher {
	r.umu.RLock()
	defer r.umu.RUnlock()
	cs := r.users[userID]
	out := make([]hub.Watcher, len(cs))
	for i, c := range cs {
		out[i] = c
	}
	return out
}

// all returns every connection.
func (r *registry) all() []*conn {
	var out []*conn
	r.each(func(c *conn) { out = append(out, c) })
	return out
}

// each calls fn for every connection, one shard at a time, without holding
// a lock while fn runs.
func (r *registry) each(fn func(*conn)) {
	var batch []*conn
	for i := range r.shards {
		sh := &r.shards[i]
		sh.mu.RLock()
		for _, c := range sh.conns {
			batch = append(batch, c)
		}
		sh.mu.RUnlock()
		for j, c := range batch {
			fn(c)
			batch[j] = nil
		}
		batch = batch[:0]
	}
}
