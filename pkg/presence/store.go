package presence

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"
)

// jsAPIPrefix is the JetStream API prefix of the default domain.
const jsAPIPrefix = "$JS.API."

// maxCASAttempts bounds the read-modify-write loop of UpdateStatus.
const maxCASAttempts = 64

// Store reads and writes greendot's buckets. It is safe for concurrent use.
//
// Reads that a decision depends on (Status, Conn) go to the stream leader, so
// they see every write acknowledged before they were sent; JetStream's direct
// gets, which kv.Get uses, may be answered by a lagging replica. A store
// told to (ReadDirect) reads with direct gets where a compare-and-set
// write makes a stale answer harmless.
type Store struct {
	nc     *nats.Conn
	js     jetstream.JetStream
	conns  jetstream.KeyValue
	leases jetstream.KeyValue
	status jetstream.KeyValue
	graph  jetstream.KeyValue
	rooms  jetstream.KeyValue
	timers jetstream.KeyValue
	opts   BucketOptions
	now    func() time.Time
	// created is when each bucket's stream was created, as the store
	// found it when it opened the buckets (see Replaced).
	created map[string]time.Time
	// copies counts the calls of DistrustCopies: a Cached filled before
	// the last one is read again before it is written from.
	copies atomic.Uint64

	// onConflict, if set, is called for every compare-and-set write of
	// UpdateStatus that lost to another writer.
	onConflict func()
	// onFeedLate, if set, is called for every status write that went
	// ahead after waiting feedWait in vain for FeedStream's copy.
	onFeedLate func()
	// feedWait bounds how long a status write waits for FeedStream to
	// copy the user's revisions before it (see feedGate).
	feedWait time.Duration
	// listStall is how long a listing waits, at first, for its watcher's
	// next entry before it starts again (see list): ListStall.
	listStall time.Duration
	// noFeedUntil is when (unix ns) the store stops believing that
	// FeedStream does not exist, as a look found (see feedGate).
	noFeedUntil atomic.Int64
	// direct is set by ReadDirect; noDirectUntil is when (unix ns) the
	// store tries direct gets again after one failed (see readStatus).
	direct        atomic.Bool
	noDirectUntil atomic.Int64
}

// buckets returns the store's buckets with where each is kept.
func (s *Store) buckets() []struct {
	name string
	kv   *jetstream.KeyValue
} {
	return []struct {
		name string
		kv   *jetstream.KeyValue
	}{{ConnsBucket, &s.conns}, {LeasesBucket, &s.leases}, {StatusBucket, &s.status}, {GraphBucket, &s.graph}, {RoomsBucket, &s.rooms}, {TimersBucket, &s.timers}}
}

// Open ensures greendot's buckets exist with the configuration opts
// asks for, and returns a Store over them. The caller owns nc.
func Open(ctx context.Context, nc *nats.Conn, opts BucketOptions) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s := &Store{nc: nc, js: js, opts: opts, now: time.Now, feedWait: FeedWait, listStall: ListStall, created: make(map[string]time.Time)}
	for _, b := range s.buckets() {
		var st jetstream.KeyValueStatus
		if *b.kv, st, err = ensureBucket(ctx, js, b.name, opts); err != nil {
			return nil, err
		}
		if s.created[b.name], err = streamCreated(ctx, js, b.name, st); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Bind returns a Store over greendot's buckets like Open, but leaves the
// configuration of buckets that exist as it is; only a missing bucket is
// created, with opts. Operator tools use it, so that a command run with
// other options never reconfigures a running deployment's buckets.
func Bind(ctx context.Context, nc *nats.Conn, opts BucketOptions) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	s := &Store{nc: nc, js: js, opts: opts, now: time.Now, feedWait: FeedWait, listStall: ListStall, created: make(map[string]time.Time)}
	for _, b := range s.buckets() {
		kv, err := js.KeyValue(ctx, b.name)
		switch {
		case err == nil:
			*b.kv = kv
		case errors.Is(err, jetstream.ErrBucketNotFound):
			*b.kv, err = EnsureBucket(ctx, js, b.name, opts)
		default:
			err = fmt.Errorf("bind bucket %q: %w", b.name, err)
		}
		if err != nil {
			return nil, err
		}
		if s.created[b.name], err = streamCreated(ctx, js, b.name, nil); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// OnConflict makes UpdateStatus call fn each time its compare-and-set
// write loses to another writer and it starts over (a counter's Inc, for a
// metric of write contention). fn must be quick and safe for concurrent
// use. Call OnConflict before the store is shared; it is not safe to call
// concurrently with UpdateStatus.
func (s *Store) OnConflict(fn func()) { s.onConflict = fn }

// OnFeedLate makes the status writes call fn each time one goes ahead
// after waiting FeedWait in vain for FeedStream to copy the revisions
// before it, which the feed may then skip (a counter's Inc). Like
// OnConflict, call it before the store is shared.
func (s *Store) OnFeedLate(fn func()) { s.onFeedLate = fn }

// JetStream returns the JetStream context the store uses.
func (s *Store) JetStream() jetstream.JetStream { return s.js }

// NATS returns the NATS connection the store uses.
func (s *Store) NATS() *nats.Conn { return s.nc }

// MarkerTTL returns ConnsBucket's marker TTL.
func (s *Store) MarkerTTL() time.Duration { return s.opts.markerTTL() }

// Ready reports whether the NATS connection is up and the buckets answer,
// each the one the store opened: a bucket created again since gives an
// error that wraps ErrStoreReplaced (see Replaced).
func (s *Store) Ready(ctx context.Context) error {
	if !s.nc.IsConnected() {
		return errors.New("nats: not connected")
	}
	_, err := s.Replaced(ctx)
	return err
}

// Replaced reports whether one of the buckets is no longer the one the
// store opened: its stream was created again since (NATS came back
// without its storage, an operator removed the bucket, a backup was
// restored), as its creation time tells. Then the revisions started again,
// and whoever holds revisions from before would compare them with
// unrelated ones: it reports true with an error that wraps
// ErrStoreReplaced. It reports false with another error while a bucket
// cannot be looked up (missing, or no answer), and false with nil when
// every bucket is the one opened. With buckets named, it looks at those
// only.
func (s *Store) Replaced(ctx context.Context, buckets ...string) (bool, error) {
	if len(buckets) == 0 {
		for _, b := range s.buckets() {
			buckets = append(buckets, b.name)
		}
	}
	for _, b := range buckets {
		opened, ok := s.created[b]
		if !ok {
			return false, fmt.Errorf("bucket %q: not one of greendot's", b)
		}
		st, err := s.js.Stream(ctx, StreamName(b))
		if err != nil {
			return false, fmt.Errorf("bucket %q: %w", b, err)
		}
		if created := st.CachedInfo().Created; !created.Equal(opened) {
			return true, fmt.Errorf("bucket %q (its stream created %s, not %s as when opened): %w",
				b, created.UTC().Format(time.RFC3339Nano), opened.UTC().Format(time.RFC3339Nano), ErrStoreReplaced)
		}
	}
	return false, nil
}

// DistrustCopies makes every write that starts from a copy of a record
// (WriteStatus) read the record again first. A process calls it when its
// NATS connection comes back: the buckets may have been replaced meanwhile
// (see Replaced), and a copy's revision may then happen to be that of an
// unrelated record, which a compare-and-set from the copy would overwrite.
func (s *Store) DistrustCopies() { s.copies.Add(1) }

// TTLSeconds rounds d up to the whole seconds JetStream TTLs are made of,
// with a minimum of one second.
func TTLSeconds(d time.Duration) time.Duration {
	if d <= time.Second {
		return time.Second
	}
	return time.Duration(math.Ceil(d.Seconds())) * time.Second
}

// rawEntry is the newest message on a key's subject.
type rawEntry struct {
	data []byte
	rev  uint64
	op   jetstream.KeyValueOp
}

// last reads the newest message on a key from the stream leader. A key that
// was never written gives ErrNotFound with rev 0; a deleted, purged or
// expired key gives ErrNotFound with the marker's revision.
func (s *Store) last(ctx context.Context, bucket, key string) (rawEntry, error) {
	msg, err := s.lastMsg(ctx, StreamName(bucket), KeySubject(bucket, key))
	if errors.Is(err, ErrNotFound) {
		return rawEntry{}, ErrNotFound
	}
	if err != nil {
		return rawEntry{}, fmt.Errorf("get %s %q: %w", bucket, key, err)
	}
	e := rawEntry{data: msg.data, rev: msg.seq, op: EntryOp(msg.hdr)}
	if e.op != jetstream.KeyValuePut {
		return e, ErrNotFound
	}
	return e, nil
}

// ReadDirect has WriteStatus read the records it has no copy of with a
// JetStream direct get, which any current replica of the bucket may
// answer, rather than from the stream leader: a direct get costs the
// server and the client a fraction of a leader read (no JSON request, no
// base64 answer). A stale answer is harmless there: a write made from it
// fails its compare-and-set, and "nothing to change" is believed only of
// a leader read (see WriteStatus). Call it before the first WriteStatus.
func (s *Store) ReadDirect() { s.direct.Store(true) }

// directRetry is how long a store whose direct get failed (refused by the
// user's permissions, say) reads from the leader before trying again.
const directRetry = time.Minute

// readStatus reads a user's newest status message, as last does: from the
// stream leader, or with a direct get when leader is false and the store
// reads direct (ReadDirect). It reports whether the answer came from the
// leader. A direct get that fails is made again from the leader.
func (s *Store) readStatus(ctx context.Context, userID string, leader bool) (rawEntry, bool, error) {
	if !leader && s.direct.Load() && s.now().UnixNano() >= s.noDirectUntil.Load() {
		e, err := s.lastDirect(ctx, StatusBucket, StatusKey(userID))
		if err == nil || errors.Is(err, ErrNotFound) {
			return e, false, err
		}
		if ctx.Err() != nil {
			return rawEntry{}, false, err
		}
		s.noDirectUntil.Store(s.now().Add(directRetry).UnixNano())
	}
	e, err := s.last(ctx, StatusBucket, StatusKey(userID))
	return e, true, err
}

// The headers of a direct get's answer that has no message.
const (
	statusHeader      = "Status"
	descriptionHeader = "Description"
)

// directGetTimeout bounds a direct get: a request the user may not make
// gets no answer at all (NATS drops it), and the read is then made from
// the leader.
const directGetTimeout = 2 * time.Second

// lastDirect reads the newest message on a key with a direct get, which
// any current replica of the bucket (or a mirror that serves direct gets)
// may answer: it may miss writes acknowledged before it. It answers as
// last does.
func (s *Store) lastDirect(ctx context.Context, bucket, key string) (rawEntry, error) {
	ctx, cancel := context.WithTimeout(ctx, directGetTimeout)
	defer cancel()
	msg, err := s.nc.RequestWithContext(ctx, jsAPIPrefix+"DIRECT.GET."+StreamName(bucket)+"."+KeySubject(bucket, key), nil)
	if err != nil {
		return rawEntry{}, fmt.Errorf("get %s %q: %w", bucket, key, err)
	}
	if len(msg.Data) == 0 {
		switch st := msg.Header.Get(statusHeader); st {
		case "":
		case "404":
			return rawEntry{}, ErrNotFound
		default:
			return rawEntry{}, fmt.Errorf("get %s %q: status %s: %s", bucket, key, st, msg.Header.Get(descriptionHeader))
		}
	}
	rev, err := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return rawEntry{}, fmt.Errorf("get %s %q: sequence of the answer: %w", bucket, key, err)
	}
	e := rawEntry{data: msg.Data, rev: rev, op: EntryOp(msg.Header)}
	if e.op != jetstream.KeyValuePut {
		return e, ErrNotFound
	}
	return e, nil
}

// streamMsg is a message read from a stream.
type streamMsg struct {
	seq  uint64
	hdr  nats.Header // nil without headers
	data []byte
}

// errNoStream is what lastMsg returns for a stream that does not exist.
var errNoStream = errors.New("no such stream")

// lastMsg reads the newest message on subject in stream from the stream
// leader: ErrNotFound when there is none, errNoStream when there is no
// such stream.
func (s *Store) lastMsg(ctx context.Context, stream, subject string) (streamMsg, error) {
	req, err := json.Marshal(struct {
		LastBySubj string `json:"last_by_subj"`
	}{subject})
	if err != nil {
		return streamMsg{}, err
	}
	msg, err := s.nc.RequestWithContext(ctx, jsAPIPrefix+"STREAM.MSG.GET."+stream, req)
	if err != nil {
		return streamMsg{}, err
	}
	var resp struct {
		Error *struct {
			Code        int    `json:"code"`
			ErrCode     int    `json:"err_code"`
			Description string `json:"description"`
		} `json:"error"`
		Message *struct {
			Seq  uint64 `json:"seq"`
			Hdrs []byte `json:"hdrs"`
			Data []byte `json:"data"`
		} `json:"message"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return streamMsg{}, fmt.Errorf("decode: %w", err)
	}
	if resp.Error != nil {
		switch resp.Error.ErrCode {
		case int(jetstream.JSErrCodeMessageNotFound):
			return streamMsg{}, ErrNotFound
		case int(jetstream.JSErrCodeStreamNotFound):
			return streamMsg{}, errNoStream
		}
		return streamMsg{}, fmt.Errorf("%s (code %d)", resp.Error.Description, resp.Error.ErrCode)
	}
	if resp.Message == nil {
		return streamMsg{}, errors.New("empty response")
	}
	m := streamMsg{seq: resp.Message.Seq, data: resp.Message.Data}
	if len(resp.Message.Hdrs) > 0 {
		if m.hdr, err = nats.DecodeHeadersMsg(resp.Message.Hdrs); err != nil {
			return streamMsg{}, fmt.Errorf("headers: %w", err)
		}
	}
	return m, nil
}

// EntryOp returns the KV operation a stream message's headers say it is:
// a put, or a delete or purge marker (expiry markers are purges).
func EntryOp(h nats.Header) jetstream.KeyValueOp {
	switch h.Get(kvOpHeader) {
	case kvOpDel:
		return jetstream.KeyValueDelete
	case kvOpPurge:
		return jetstream.KeyValuePurge
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "":
		return jetstream.KeyValuePut
	case "Remove":
		return jetstream.KeyValueDelete
	default: // MaxAge (an expired key), Purge
		return jetstream.KeyValuePurge
	}
}

// The KV operation header and its values.
const (
	kvOpHeader = "KV-Operation"
	kvOpDel    = "DEL"
	kvOpPurge  = "PURGE"
)

// deleteMsg returns the marker a KV delete of key in bucket publishes,
// for a caller that gives it a TTL (which a KV delete cannot).
func deleteMsg(bucket, key string) *nats.Msg {
	msg := &nats.Msg{Subject: KeySubject(bucket, key), Header: nats.Header{}}
	msg.Header.Set(kvOpHeader, kvOpDel)
	return msg
}

// Status reads a user's Record from the stream leader. It returns ErrNotFound
// (and a zero Record) when the user has none; rev is then the revision to
// create it at.
func (s *Store) Status(ctx context.Context, userID string) (Record, uint64, error) {
	var r Record
	_, rev, err := s.statusUnfed(ctx, userID, &r)
	return r, rev, err
}

// stored is a Record as StatusBucket keeps it: with unfed, the user's
// revisions, this one included, written since the last one known to be
// copied into FeedStream (or found to have no FeedStream to be copied
// into). The Store counts it: a write that would make it more than
// StatusHistory first waits for the copy (see feedGate), since the bucket
// then drops the user's oldest revision.
type stored struct {
	*Record
	Unfed int `json:"uf,omitempty"`
}

// statusUnfed reads a user's record into r, as Status does, and returns
// its unfed count too.
func (s *Store) statusUnfed(ctx context.Context, userID string, r *Record) (unfed int, rev uint64, err error) {
	e, err := s.last(ctx, StatusBucket, StatusKey(userID))
	if err != nil {
		return 0, e.rev, err
	}
	unfed, err = decodeStored(e.data, r, userID)
	return unfed, e.rev, err
}

// decodeStored decodes userID's stored record into r and returns its
// unfed count.
func decodeStored(data []byte, r *Record, userID string) (int, error) {
	st := stored{Record: r}
	if err := json.Unmarshal(data, &st); err != nil {
		*r = Record{}
		return 0, fmt.Errorf("decode status of %q: %w", userID, err)
	}
	return st.Unfed, nil
}

// UpdateStatus changes a user's Record by compare-and-set. It reads the
// record (a zero Record if there is none), lets mutate change Chosen and
// Conns on a copy, recomputes the derived fields, and writes the copy only if
// the revision it read is still the newest; otherwise it starts over.
//
// mutate may be called several times, each time right after a fresh read
// of the record, so a read it makes is at least as fresh as the record it is
// given. When it returns ErrNoChange nothing is written and UpdateStatus returns the
// current record with written false; any other error is returned as is.
func (s *Store) UpdateStatus(ctx context.Context, userID string, mutate func(*Record) error) (rec Record, rev uint64, written bool, err error) {
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		var cur Record
		unfed, curRev, err := s.statusUnfed(ctx, userID, &cur)
		if err != nil && !errors.Is(err, ErrNotFound) {
			return Record{}, 0, false, err
		}
		next := cur.Clone()
		if err := mutate(&next); err != nil {
			if errors.Is(err, ErrNoChange) {
				return cur, curRev, false, nil
			}
			return Record{}, 0, false, err
		}
		data, _, err := s.encodeNext(ctx, userID, &cur, &next, unfed, curRev)
		if err != nil {
			return Record{}, 0, false, err
		}
		newRev, err := s.status.Update(ctx, StatusKey(userID), data, curRev)
		if err == nil {
			return next, newRev, true, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return Record{}, 0, false, fmt.Errorf("write status of %q: %w", userID, err)
		}
		if s.onConflict != nil {
			s.onConflict()
		}
		if attempt > 2 {
			// Several writers are racing on this user: let them spread out.
			select {
			case <-ctx.Done():
				return Record{}, 0, false, ctx.Err()
			case <-time.After(time.Duration(attempt) * time.Millisecond):
			}
		}
	}
	return Record{}, 0, false, fmt.Errorf("write status of %q: %w", userID, ErrConflict)
}

// Cached is a writer's copy of a user's Record and its revision, which
// WriteStatus starts from and keeps up to date.
type Cached struct {
	// The copy is kept one of two ways. After a read, or a write that
	// started from a read, it is data, the record as stored, decoded when
	// a write starts from it: most users are written once when they
	// connect and not again for minutes, and the encoded record is a
	// fraction of the decoded one's size. After a write that started
	// from the copy (a user written again soon, as one whose status
	// changes), it is rec, the record decoded, with unfed its count (see
	// stored), so that a user written often is not decoded each time.
	data  []byte
	rec   *Record
	unfed int
	Rev   uint64
	// gen is the store's DistrustCopies count when the copy was made.
	gen uint64
	// Valid reports that the copy and Rev were read or written; the zero
	// Cached knows nothing.
	Valid bool
}

// current returns the cached record and its unfed count: rec's fields
// (sharing its connections, which nobody changes), or data decoded.
func (c *Cached) current(userID string) (Record, int, error) {
	if c.rec != nil {
		return *c.rec, c.unfed, nil
	}
	var r Record
	if len(c.data) == 0 {
		return r, 0, nil
	}
	unfed, err := decodeStored(c.data, &r, userID)
	return r, unfed, err
}

// Write is what one status write did.
type Write struct {
	// Prev is the record the write was made over (the zero Record for a
	// new key), Next the record written, at revision Rev.
	Prev, Next Record
	Rev        uint64
	// Written is false when mutate said there was nothing to change: Next
	// and Rev are then the current record.
	Written bool
}

// WriteStatus changes a user's Record by compare-and-set, like
// UpdateStatus, but starts from the writer's cached copy when it has one:
// a writer that is the only one to change a record (a user's gateway)
// saves a read per write. When the cache is out of date, the write fails
// its compare-and-set, and the record is read and the mutation applied
// again; and "nothing to change" is believed only of a fresh read. The
// cache is left holding what was written (or read).
//
// Unlike with UpdateStatus, mutate may be given a cached record: it must
// not decide from reads of other state, unless the writer keeps no cache
// (a zero Cached each call), for then every attempt starts from a fresh
// read of the record, as with UpdateStatus. The records of the Write it
// returns may share their connections with the cache: the caller reads
// them and changes nothing in them.
func (s *Store) WriteStatus(ctx context.Context, userID string, cache *Cached, mutate func(*Record) error) (Write, error) {
	// leader is set once a read or a copy led nowhere: it said nothing
	// was to change, or a write from it lost (see ReadDirect).
	leader := false
	for attempt := 0; attempt < maxCASAttempts; attempt++ {
		gen := s.copies.Load()
		fresh := !cache.Valid || cache.gen != gen
		fromLeader := false
		if fresh {
			e, ok, err := s.readStatus(ctx, userID, leader)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return Write{}, err
			}
			fromLeader = ok
			*cache = Cached{data: e.data, Rev: e.rev, gen: gen, Valid: true}
		}
		cur, unfed, err := cache.current(userID)
		if err != nil {
			cache.Valid = false
			return Write{}, err
		}
		curRev := cache.Rev
		next := cur.Clone()
		if err := mutate(&next); err != nil {
			if !errors.Is(err, ErrNoChange) {
				return Write{}, err
			}
			if fromLeader {
				return Write{Prev: cur, Next: cur, Rev: curRev}, nil
			}
			// Nothing to change in the cached copy (or in a direct read)
			// says nothing of the record, which another writer may have
			// changed since: only a fresh read from the leader can tell.
			cache.Valid = false
			leader = true
			attempt--
			continue
		}
		data, nextUnfed, err := s.encodeNext(ctx, userID, &cur, &next, unfed, curRev)
		if err != nil {
			return Write{}, err
		}
		newRev, err := s.status.Update(ctx, StatusKey(userID), data, curRev)
		if err == nil {
			if fresh {
				*cache = Cached{data: data, Rev: newRev, gen: gen, Valid: true}
			} else {
				kept := next
				kept.ended = 0 // not stored: a decoded copy has none
				*cache = Cached{rec: &kept, unfed: nextUnfed, Rev: newRev, gen: gen, Valid: true}
			}
			return Write{Prev: cur, Next: next, Rev: newRev, Written: true}, nil
		}
		cache.Valid = false
		leader = true // another writer came first: a direct get may not see it yet
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return Write{}, fmt.Errorf("write status of %q: %w", userID, err)
		}
		if s.onConflict != nil {
			s.onConflict()
		}
		if attempt > 2 {
			select {
			case <-ctx.Done():
				return Write{}, ctx.Err()
			case <-time.After(time.Duration(attempt) * time.Millisecond):
			}
		}
	}
	return Write{}, fmt.Errorf("write status of %q: %w", userID, ErrConflict)
}

// encodeNext finishes next, written over cur (whose unfed count is unfed,
// at revision curRev), and returns it as StatusBucket stores it, with its
// own count, and that count; it waits for FeedStream's copy first when
// feedGate says so.
func (s *Store) encodeNext(ctx context.Context, userID string, cur, next *Record, unfed int, curRev uint64) ([]byte, int, error) {
	next.Finish(cur, s.now())
	next.PubSince = pubSince(cur, next, curRev)
	unfed, err := s.feedGate(ctx, userID, unfed, curRev)
	if err != nil {
		return nil, 0, err
	}
	data, err := json.Marshal(stored{next, unfed})
	return data, unfed, err
}

// FeedWait is how long a status write waits at most for FeedStream to copy
// the user's revisions before it, when the bucket would otherwise drop one
// it has not copied yet (see stored); then it goes ahead.
const FeedWait = 5 * time.Second

// feedAbsentFor is how long a Store believes FeedStream missing once a
// look found it so: without it, every user's every StatusHistory-th write
// would ask NATS's stream API again, a request the server handles under
// its account's locks, for a stream most deployments never create. A feed
// created meanwhile (greendot buckets --feed) is looked at again within
// that time.
const feedAbsentFor = time.Second

// feedGate returns the unfed count of a write over the record at revision
// curRev, whose count is unfed (see stored). While StatusBucket keeps
// every revision of the user that FeedStream may not have copied yet, it
// only counts. When the write would make the bucket drop one of those
// (unfed is StatusHistory), it first waits until FeedStream holds curRev
// (or is found not to exist, or was within feedAbsentFor), polling it, for
// at most feedWait; a write that goes ahead without the copy is counted by
// onFeedLate. It returns ctx's error if ctx ends first.
func (s *Store) feedGate(ctx context.Context, userID string, unfed int, curRev uint64) (int, error) {
	if unfed < StatusHistory {
		return unfed + 1, nil
	}
	if s.now().UnixNano() < s.noFeedUntil.Load() {
		return 1, nil
	}
	wait, cancel := context.WithTimeout(ctx, s.feedWait)
	defer cancel()
	subject := KeySubject(StatusBucket, StatusKey(userID))
	for pause := time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		m, err := s.lastMsg(wait, FeedStream, subject)
		if errors.Is(err, errNoStream) {
			s.noFeedUntil.Store(s.now().Add(feedAbsentFor).UnixNano())
			return 1, nil
		}
		if err == nil {
			if rev, ok := FeedRevision(m.hdr); ok && rev >= curRev {
				return 1, nil
			}
		}
		t := time.NewTimer(pause)
		select {
		case <-wait.Done():
			t.Stop()
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			if s.onFeedLate != nil {
				s.onFeedLate()
			}
			return 1, nil
		case <-t.C:
		}
	}
}

// DeleteStatus removes a user's Record, as `nats kv del` would.
func (s *Store) DeleteStatus(ctx context.Context, userID string) error {
	return s.status.Delete(ctx, StatusKey(userID))
}

// IsWrongLastSequence reports whether err is JetStream refusing a write
// because the key's newest revision is not the one the write expected.
func IsWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// CreateConn creates a connection's key with the given TTL (rounded up to
// whole seconds). It succeeds over the marker of an earlier life of the key
// and returns the new revision.
func (s *Store) CreateConn(ctx context.Context, userID, connID string, rec ConnRecord, ttl time.Duration) (uint64, error) {
	key := ConnKey(userID, connID)
	data, err := json.Marshal(&rec)
	if err != nil {
		return 0, err
	}
	rev, err := s.conns.Create(ctx, key, data, jetstream.KeyTTL(TTLSeconds(ttl)))
	if err != nil {
		return 0, fmt.Errorf("create connection %q: %w", key, err)
	}
	return rev, nil
}

// ConnMsg returns the message that writes rec as a connection's key with a
// fresh TTL, to be published with WriteConnOpts.
func ConnMsg(userID, connID string, rec *ConnRecord) (*nats.Msg, error) {
	data, err := json.Marshal(rec)
	if err != nil {
		return nil, err
	}
	return &nats.Msg{Subject: KeySubject(ConnsBucket, ConnKey(userID, connID)), Data: data}, nil
}

// WriteConnOpts returns the publish options of a connection key write: a
// TTL (rounded up to whole seconds), and the revision the key must still
// have. A write that fails IsWrongLastSequence means the key expired or was
// removed: the connection must be created again.
func WriteConnOpts(ttl time.Duration, rev uint64) []jetstream.PublishOpt {
	return []jetstream.PublishOpt{
		jetstream.WithMsgTTL(TTLSeconds(ttl)),
		jetstream.WithExpectLastSequencePerSubject(rev),
	}
}

// WriteConn writes a connection's key synchronously, with a TTL, if its
// newest revision is still rev. It returns the new revision.
func (s *Store) WriteConn(ctx context.Context, userID, connID string, rec ConnRecord, ttl time.Duration, rev uint64) (uint64, error) {
	msg, err := ConnMsg(userID, connID, &rec)
	if err != nil {
		return 0, err
	}
	ack, err := s.js.PublishMsg(ctx, msg, WriteConnOpts(ttl, rev)...)
	if err != nil {
		return 0, fmt.Errorf("write connection %q: %w", ConnKey(userID, connID), err)
	}
	return ack.Sequence, nil
}

// PurgeConn removes a connection's key at once. The purge marker stays for
// the bucket's marker TTL, so watchers and the reaper see it.
func (s *Store) PurgeConn(ctx context.Context, userID, connID string) error {
	return s.conns.Purge(ctx, ConnKey(userID, connID), jetstream.PurgeTTL(s.opts.markerTTL()))
}

// Conn reads a connection's key from the stream leader. It returns
// ErrNotFound when the key is gone, with the revision of its marker if any.
func (s *Store) Conn(ctx context.Context, userID, connID string) (ConnRecord, uint64, error) {
	e, err := s.last(ctx, ConnsBucket, ConnKey(userID, connID))
	if err != nil {
		return ConnRecord{}, e.rev, err
	}
	var r ConnRecord
	if err := json.Unmarshal(e.data, &r); err != nil {
		return ConnRecord{}, e.rev, fmt.Errorf("decode connection %q: %w", ConnKey(userID, connID), err)
	}
	return r, e.rev, nil
}

// Follows reports whether a follows b.
func (s *Store) Follows(ctx context.Context, a, b string) (bool, error) {
	_, err := s.graph.Get(ctx, FollowKey(a, b))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return false, nil
	default:
		return false, fmt.Errorf("read follow %s -> %s: %w", a, b, err)
	}
}

// Following returns everyone a follows.
func (s *Store) Following(ctx context.Context, a string) ([]string, error) {
	out, _, err := s.FollowingAtMost(ctx, a, 0)
	return out, err
}

// FollowingAtMost returns everyone a follows, and true, when they are at
// most max; past max it stops reading, and returns the first max it read
// and false. A max of 0 or less reads them all.
func (s *Store) FollowingAtMost(ctx context.Context, a string, max int) ([]string, bool, error) {
	out, all, err := s.follows(ctx, FollowingFilter(a), max, func(_, b string) string { return b })
	if err != nil {
		return nil, false, fmt.Errorf("list follows of %s: %w", a, err)
	}
	return out, all, nil
}

// Followers returns everyone who follows b. NATS finds their keys by
// walking those of every user who follows anyone: it is for tools, not
// for a path that serves many users.
func (s *Store) Followers(ctx context.Context, b string) ([]string, error) {
	out, _, err := s.follows(ctx, FollowersFilter(b), 0, func(a, _ string) string { return a })
	if err != nil {
		return nil, fmt.Errorf("list followers of %s: %w", b, err)
	}
	return out, nil
}

// errEnough stops a listing that has found what it was asked for.
var errEnough = errors.New("listed enough")

// follows lists the follow keys that match filter, and returns pick's
// choice of each key's two users, once each, and whether that is all of
// them: past max (unless max is 0 or less) it stops reading and returns
// the first max.
//
// It asks for the keys' newest values in one batch (a direct get of the
// last message of every subject the filter matches), whose cost does not
// grow with the graph; a listing (a watcher: a consumer NATS sets up for
// it, whose cost does) is the fallback where NATS answers no batch (see
// followsBatch): more than it gives at once (1,024 keys, deleted ones
// counted), or no answer in time.
func (s *Store) follows(ctx context.Context, filter string, max int, pick func(a, b string) string) ([]string, bool, error) {
	if out, all, ok, err := s.followsBatch(ctx, filter, max, pick); ok || err != nil {
		return out, all, err
	}
	return s.followsListed(ctx, filter, max, pick)
}

// batchWait bounds the wait for a batch of direct gets: one NATS does not
// answer in that time is listed instead. A user without the permission
// to ask for it (permissions that allow only single keys' subjects) gets
// no answer at all, only the server's log of the violation.
const batchWait = 2 * time.Second

// followsBatch is follows in one batch of direct gets. It reports false,
// and no error, when NATS answers no batch for filter: more keys than it
// gives at once (an answer of 413, which jetstreamext reads as a server
// without batches), a server without them, a bucket without direct gets
// (no responders), or no answer within batchWait. It fails when ctx ends.
func (s *Store) followsBatch(ctx context.Context, filter string, max int, pick func(a, b string) string) ([]string, bool, bool, error) {
	// The batch's messages end quietly when its context does, as if they
	// were all: which context ended tells the two apart.
	bctx, cancel := context.WithTimeout(ctx, batchWait)
	defer cancel()
	noBatch := func(err error) bool {
		return errors.Is(err, jetstreamext.ErrBatchUnsupported) || errors.Is(err, nats.ErrNoResponders)
	}
	msgs, err := jetstreamext.GetLastMsgsFor(bctx, s.js, StreamName(GraphBucket), []string{KeySubject(GraphBucket, filter)})
	if noBatch(err) {
		return nil, false, false, nil
	} else if err != nil {
		return nil, false, false, fmt.Errorf("read %s: %w", filter, err)
	}
	prefix := KeySubject(GraphBucket, "")
	var out []string
	for m, err := range msgs {
		switch {
		case errors.Is(err, jetstreamext.ErrNoMessages):
			return nil, true, true, nil // no key matches
		case noBatch(err):
			return nil, false, false, nil
		case err != nil:
			return nil, false, false, fmt.Errorf("read %s: %w", filter, err)
		}
		if EntryOp(m.Header) != jetstream.KeyValuePut {
			continue // unfollowed
		}
		if a, b, ok := ParseFollowKey(strings.TrimPrefix(m.Subject, prefix)); ok {
			if max > 0 && len(out) == max {
				return out, false, true, nil
			}
			out = append(out, pick(a, b))
		}
	}
	switch {
	case ctx.Err() != nil:
		return nil, false, false, fmt.Errorf("read %s: %w", filter, ctx.Err())
	case bctx.Err() != nil:
		return nil, false, false, nil // no answer in time
	}
	return out, true, true, nil
}

// followsListed is follows by a listing of the keys.
func (s *Store) followsListed(ctx context.Context, filter string, max int, pick func(a, b string) string) ([]string, bool, error) {
	seen := make(map[string]bool)
	var out []string
	err := s.list(ctx, s.graph, []string{filter}, func(e jetstream.KeyValueEntry) error {
		if a, b, ok := ParseFollowKey(e.Key()); ok && !seen[e.Key()] {
			if max > 0 && len(out) == max {
				return errEnough
			}
			seen[e.Key()] = true
			out = append(out, pick(a, b))
		}
		return nil
	})
	if errors.Is(err, errEnough) {
		return out, false, nil
	}
	return out, true, err
}

// Follow records that a follows b.
func (s *Store) Follow(ctx context.Context, a, b string) error {
	if !ValidUserID(a) || !ValidUserID(b) {
		return fmt.Errorf("%w: follow %q -> %q", ErrInvalidUserID, a, b)
	}
	_, err := s.graph.Put(ctx, FollowKey(a, b), []byte(s.now().UTC().Format(time.RFC3339)))
	return err
}

// Unfollow records that a no longer follows b.
func (s *Store) Unfollow(ctx context.Context, a, b string) error {
	if !ValidUserID(a) || !ValidUserID(b) {
		return fmt.Errorf("%w: unfollow %q -> %q", ErrInvalidUserID, a, b)
	}
	return s.graph.Delete(ctx, FollowKey(a, b))
}

// Settings reads a user's privacy settings; a user with none has the zero
// Settings (last_seen visible to contacts).
func (s *Store) Settings(ctx context.Context, userID string) (Settings, error) {
	e, err := s.graph.Get(ctx, SettingsKey(userID))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Settings{}, nil
	}
	if err != nil {
		return Settings{}, fmt.Errorf("read settings of %q: %w", userID, err)
	}
	return DecodeSettings(e.Value())
}

// DecodeSettings decodes a settings value. Besides the JSON object, it
// accepts a bare visibility ("nobody"), which is what an operator typing
// `nats kv put presence_graph settings.alice nobody` means.
func DecodeSettings(data []byte) (Settings, error) {
	trimmed := strings.TrimSpace(string(data))
	if v, err := ParseVisibility(trimmed); err == nil {
		return Settings{LastSeen: v}, nil
	}
	var st Settings
	if err := json.Unmarshal(data, &st); err != nil {
		return Settings{}, fmt.Errorf("decode settings %q: %w", trimmed, err)
	}
	if st.LastSeen != "" {
		if _, err := ParseVisibility(string(st.LastSeen)); err != nil {
			return Settings{}, err
		}
	}
	return st, nil
}

// SetSettings writes a user's privacy settings.
func (s *Store) SetSettings(ctx context.Context, userID string, st Settings) error {
	if !ValidUserID(userID) {
		return fmt.Errorf("%w: %q", ErrInvalidUserID, userID)
	}
	if _, err := ParseVisibility(string(st.LastSeenVisibility())); err != nil {
		return err
	}
	data, err := json.Marshal(&st)
	if err != nil {
		return err
	}
	_, err = s.graph.Put(ctx, SettingsKey(userID), data)
	return err
}

// WatchGraph watches changes to the graph bucket from now on (no initial
// values). The caller stops the watcher.
func (s *Store) WatchGraph(ctx context.Context) (jetstream.KeyWatcher, error) {
	return s.graph.WatchAll(ctx, jetstream.UpdatesOnly())
}

// WatchStatus watches every user's Record: first the current ones, then a
// nil entry, then every change (deleted records included). The caller stops
// the watcher.
func (s *Store) WatchStatus(ctx context.Context) (jetstream.KeyWatcher, error) {
	return s.status.WatchAll(ctx)
}

// ScanStatus calls fn with every user's Record and revision (see scan for
// what a record written during the scan may show), skipping values that
// are not JSON of a Record (not greendot's; the fanout logs these). It
// stops early if fn returns an error, and returns it.
func (s *Store) ScanStatus(ctx context.Context, fn func(userID string, rec Record, rev uint64) error) error {
	return s.ScanStatusAll(ctx, fn, nil)
}

// ScanStatusAll is ScanStatus, and calls skipped, unless it is nil, with
// the key of every value ScanStatus skips and the decoding error.
func (s *Store) ScanStatusAll(ctx context.Context, fn func(userID string, rec Record, rev uint64) error, skipped func(key string, err error)) error {
	return s.scan(ctx, s.status, func(e jetstream.KeyValueEntry) error {
		var rec Record
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			if skipped != nil {
				skipped(e.Key(), err)
			}
			return nil
		}
		return fn(e.Key(), rec, e.Revision())
	})
}

// ScanConns calls fn with every live connection key and its record (see
// scan: a key written during the scan may be missed, so a key's absence
// must be confirmed with Conn before anything is concluded from it). It
// stops early if fn returns an error, and returns it.
func (s *Store) ScanConns(ctx context.Context, fn func(userID, connID string, rec ConnRecord, rev uint64) error) error {
	return s.scan(ctx, s.conns, func(e jetstream.KeyValueEntry) error {
		userID, connID, ok := SplitConnKey(e.Key())
		if !ok {
			return nil
		}
		var rec ConnRecord
		if err := json.Unmarshal(e.Value(), &rec); err != nil {
			return nil
		}
		return fn(userID, connID, rec, e.Revision())
	})
}

// UserConns returns the live connection keys of one user. Like a scan, it
// may miss a key written while it runs.
func (s *Store) UserConns(ctx context.Context, userID string) (map[string]ConnRecord, error) {
	out := make(map[string]ConnRecord)
	err := s.list(ctx, s.conns, []string{ConnKeyFilter(userID)}, func(e jetstream.KeyValueEntry) error {
		_, connID, ok := SplitConnKey(e.Key())
		var rec ConnRecord
		if ok && json.Unmarshal(e.Value(), &rec) == nil {
			out[connID] = rec
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("connections of %q: %w", userID, err)
	}
	return out, nil
}

// scan calls fn with the newest value of every live key of a bucket, as a
// KV watcher delivers them up to its first nil entry.
//
// That is not a consistent snapshot. The watcher counts the messages it
// delivers against the number pending when it started; a key written again
// while it runs has its older message skipped and its newer one delivered
// after those of other keys, possibly after the nil, and the pending counts
// the server reports lag behind such writes. So a key that exists
// throughout the scan can be missed if it is written during it (a live
// connection's heartbeat refresh, every few seconds), and a key can be seen
// in a revision newer than others'. Callers use a scan to find candidates,
// and read each key they act on from the stream leader (Status, Conn).
func (s *Store) scan(ctx context.Context, kv jetstream.KeyValue, fn func(jetstream.KeyValueEntry) error) error {
	return s.list(ctx, kv, []string{">"}, fn)
}

// ListStall is how long a listing waits, at first, for the next entry of
// its watcher before it starts again.
const ListStall = 2 * time.Second

// list calls fn with the newest value of every live key of a bucket that
// matches one of filters, as scan does.
//
// A watcher ends its first listing after as many messages as the server
// counted pending when it started; when some of them are removed before it
// gets them (a lease's keys purged by a reaper, a key's TTL), it waits for
// them forever. nats.go's jetstream KV has no guard against that. So a
// listing that hears nothing from its watcher for s.listStall starts again
// with a new one, waiting twice as long each time (a watcher merely slow on
// a loaded machine is not cut short): fn may then see a key a second time.
func (s *Store) list(ctx context.Context, kv jetstream.KeyValue, filters []string, fn func(jetstream.KeyValueEntry) error) error {
	for stall := s.listStall; ; stall = min(2*stall, time.Minute) {
		done, err := listOnce(ctx, kv, filters, stall, fn)
		if done || err != nil {
			return err
		}
	}
}

// listOnce runs one listing of list. It reports false, and no error, when
// its watcher stalled.
func listOnce(ctx context.Context, kv jetstream.KeyValue, filters []string, stall time.Duration, fn func(jetstream.KeyValueEntry) error) (bool, error) {
	// WatchFiltered writes the subjects into the slice it is given.
	w, err := kv.WatchFiltered(ctx, slices.Clone(filters), jetstream.IgnoreDeletes())
	if err != nil {
		return false, fmt.Errorf("list %s %v: %w", kv.Bucket(), filters, err)
	}
	defer func() { _ = w.Stop() }()
	stalled := time.NewTimer(stall)
	defer stalled.Stop()
	for {
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-stalled.C:
			return false, nil
		case e, ok := <-w.Updates():
			if !ok {
				return false, fmt.Errorf("list %s %v: watcher stopped", kv.Bucket(), filters)
			}
			if e == nil {
				return true, nil // every key seen
			}
			if err := fn(e); err != nil {
				return false, err
			}
			stalled.Reset(stall)
		}
	}
}
