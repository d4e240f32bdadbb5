package gateway

import (
	"sync"
	"sync/atomic"
)

// registry holds every open connection by tag, sharded so that the poller,
// the sweeper and new connections rarely wait for each other. It is safe
// for concurrent use.
type registry struct {
	next   atomic.Uint64
	count  atomic.Int64
	shards [registryShards]registryShard
}

const registryShards = 64

type registryShard struct {
	mu    sync.RWMutex
	conns map[uint64]*conn
}

func newRegistry() *registry {
	r := &registry{}
	for i := range r.shards {
		r.shards[i].conns = make(map[uint64]*conn)
	}
	return r
}

// add assigns c a tag and holds it.
func (r *registry) add(c *conn) {
	c.tag = r.next.Add(1)
	sh := &r.shards[c.tag%registryShards]
	sh.mu.Lock()
	sh.conns[c.tag] = c
	sh.mu.Unlock()
	r.count.Add(1)
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
	if ok {
		r.count.Add(-1)
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
