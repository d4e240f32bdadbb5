package presence

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// CreateLease creates a gateway's lease key with the given TTL (rounded up
// to whole seconds) and returns its revision. It fails if the key exists.
func (s *Store) CreateLease(ctx context.Context, rec LeaseRecord, ttl time.Duration) (uint64, error) {
	data, err := json.Marshal(&rec)
	if err != nil {
		return 0, err
	}
	key := LeaseKey(rec.Gateway, rec.Epoch)
	rev, err := s.leases.Create(ctx, key, data, jetstream.KeyTTL(TTLSeconds(ttl)))
	if err != nil {
		return 0, fmt.Errorf("create lease %q: %w", key, err)
	}
	return rev, nil
}

// LeaseMsg returns the message that writes a lease again, to be published
// with RefreshOpts: a refresh of its TTL.
func LeaseMsg(rec *LeaseRecord) (*nats.Msg, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: KeySubject(LeasesBucket, LeaseKey(rec.Gateway, rec.Epoch)), Data: data}, nil
}

// RefreshOpts returns the publish options that rewrite a key with a fresh
// TTL (rounded up to whole seconds) only if its newest revision is still
// rev. A write that fails IsWrongLastSequence means the key is gone (or
// was written since).
func RefreshOpts(ttl time.Duration, rev uint64) []jetstream.PublishOpt {
	return []jetstream.PublishOpt{
		jetstream.WithMsgTTL(TTLSeconds(ttl)),
		jetstream.WithExpectLastSequencePerSubject(rev),
	}
}

// Lease reads a gateway's lease from the stream leader. It returns
// ErrNotFound when the lease ended (or never was).
func (s *Store) Lease(ctx context.Context, gatewayID, epoch string) (LeaseRecord, uint64, error) {
	e, err := s.last(ctx, LeasesBucket, LeaseKey(gatewayID, epoch))
	if err != nil {
		return LeaseRecord{}, e.rev, err
	}
	var r LeaseRecord
	if err := json.Unmarshal(e.data, &r); err != nil {
		return LeaseRecord{}, e.rev, fmt.Errorf("decode lease %q: %w", LeaseKey(gatewayID, epoch), err)
	}
	return r, e.rev, nil
}

// DeleteLease ends a gateway's lease now, if its newest revision is rev
// (any revision, if rev is zero):
// what a gateway does when it stops, once its connections are gone. The
// reaper learns of it as of an expiry, and the delete marker stays
// LeaseMarkerTTL, as an expired lease's does, so that leases that come
// and go leave nothing behind.
func (s *Store) DeleteLease(ctx context.Context, gatewayID, epoch string, rev uint64) error {
	key := LeaseKey(gatewayID, epoch)
	opts := []jetstream.PublishOpt{jetstream.WithMsgTTL(LeaseMarkerTTL)}
	if rev != 0 { // zero: whatever its revision, as a KV delete
		opts = append(opts, jetstream.WithExpectLastSequencePerSubject(rev))
	}
	_, err := s.js.PublishMsg(ctx, deleteMsg(LeasesBucket, key), opts...)
	if err != nil {
		return fmt.Errorf("delete lease %q: %w", key, err)
	}
	return nil
}

// Leases returns every live lease, by key. Like a scan, it may miss a
// lease written while it runs: confirm an absence with Lease.
func (s *Store) Leases(ctx context.Context) (map[string]LeaseRecord, error) {
	out := make(map[string]LeaseRecord)
	err := s.scan(ctx, s.leases, func(e jetstream.KeyValueEntry) error {
		var r LeaseRecord
		if json.Unmarshal(e.Value(), &r) == nil {
			out[e.Key()] = r
		}
		return nil
	})
	return out, err
}

// LeaseConn is a connection held under a lease, as its key names it.
type LeaseConn struct {
	Gateway, Epoch, UserID, ConnID string
}

// Key returns the connection's ConnsBucket key.
func (c LeaseConn) Key() string { return LeaseConnKey(c.Gateway, c.Epoch, c.UserID, c.ConnID) }

// LeaseConnRecord reads the key of a connection held under a lease from
// the stream leader. It returns ErrNotFound when the key is gone.
func (s *Store) LeaseConnRecord(ctx context.Context, c LeaseConn) (ConnRecord, uint64, error) {
	e, err := s.last(ctx, ConnsBucket, c.Key())
	if err != nil {
		return ConnRecord{}, e.rev, err
	}
	var r ConnRecord
	if err := json.Unmarshal(e.data, &r); err != nil {
		return ConnRecord{}, e.rev, fmt.Errorf("decode connection %q: %w", c.Key(), err)
	}
	return r, e.rev, nil
}

// CreateLeaseConn creates the key of a connection held under a lease. It
// has no TTL: the lease keeps it alive. It returns the key's revision.
func (s *Store) CreateLeaseConn(ctx context.Context, c LeaseConn, rec ConnRecord) (uint64, error) {
	data, err := json.Marshal(&rec)
	if err != nil {
		return 0, err
	}
	rev, err := s.conns.Create(ctx, c.Key(), data)
	if err != nil {
		return 0, fmt.Errorf("create connection %q: %w", c.Key(), err)
	}
	return rev, nil
}

// LeaseConnMsg returns the message that rewrites the key of a connection
// held under a lease, to be published as it is (no TTL).
func LeaseConnMsg(c LeaseConn, rec *ConnRecord) (*nats.Msg, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: KeySubject(ConnsBucket, c.Key()), Data: data}, nil
}

// RemoveLeaseConn removes the key of a connection held under a lease, as
// its gateway does once the connection's record entry is gone. Its purge
// marker expires with the bucket's marker TTL; nothing needs to see it
// (keys of the earlier shape are the only ones whose markers are acted
// on). Removing a key that is gone is not an error.
func (s *Store) RemoveLeaseConn(ctx context.Context, c LeaseConn) error {
	if err := s.conns.Purge(ctx, c.Key(), jetstream.PurgeTTL(s.opts.markerTTL())); err != nil {
		return fmt.Errorf("remove connection %q: %w", c.Key(), err)
	}
	return nil
}

// RemoveLeaseConns removes the keys of every connection held under a
// lease, in one request (a purge of the stream by subject, which leaves no
// marker): what a reaper does once a lease's end is applied.
func (s *Store) RemoveLeaseConns(ctx context.Context, gatewayID, epoch string) error {
	return s.purgeConns(ctx, KeySubject(ConnsBucket, LeaseConnsFilter(gatewayID, epoch)))
}

func (s *Store) purgeConns(ctx context.Context, subject string) error {
	st, err := s.js.Stream(ctx, StreamName(ConnsBucket))
	if err != nil {
		return fmt.Errorf("remove %s: %w", subject, err)
	}
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(subject)); err != nil {
		return fmt.Errorf("remove %s: %w", subject, err)
	}
	return nil
}

// LeaseConns returns the connections held under a lease, from their keys.
func (s *Store) LeaseConns(ctx context.Context, gatewayID, epoch string) ([]LeaseConn, error) {
	return s.listLeaseConns(ctx, LeaseConnsFilter(gatewayID, epoch))
}

// UserLeaseConns returns the connections of a user held under any lease,
// with their records. Like a scan, it may miss a key written while it
// runs.
func (s *Store) UserLeaseConns(ctx context.Context, userID string) (map[LeaseConn]ConnRecord, error) {
	out := make(map[LeaseConn]ConnRecord)
	err := s.list(ctx, s.conns, []string{UserConnsFilter(userID)}, func(e jetstream.KeyValueEntry) error {
		gw, epoch, u, c, ok := ParseLeaseConnKey(e.Key())
		var rec ConnRecord
		if ok && json.Unmarshal(e.Value(), &rec) == nil {
			out[LeaseConn{gw, epoch, u, c}] = rec
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("connections of %q: %w", userID, err)
	}
	return out, nil
}

func (s *Store) listLeaseConns(ctx context.Context, filter string) ([]LeaseConn, error) {
	seen := make(map[LeaseConn]bool)
	var out []LeaseConn
	err := s.list(ctx, s.conns, []string{filter}, func(e jetstream.KeyValueEntry) error {
		gw, epoch, u, c, ok := ParseLeaseConnKey(e.Key())
		if k := (LeaseConn{gw, epoch, u, c}); ok && !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list connections %s: %w", filter, err)
	}
	return out, nil
}

// ScanLeaseConns calls fn with every connection held under a lease (see
// scan: a key written during the scan may be missed). It stops early if fn
// returns an error, and returns it.
func (s *Store) ScanLeaseConns(ctx context.Context, fn func(LeaseConn) error) error {
	return s.scan(ctx, s.conns, func(e jetstream.KeyValueEntry) error {
		gw, epoch, u, c, ok := ParseLeaseConnKey(e.Key())
		if !ok {
			return nil
		}
		return fn(LeaseConn{gw, epoch, u, c})
	})
}
