package webhook

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/greendot/greendot/pkg/presence"
)

// Every message of presence_feed matches the consumer's filter, so the
// server hands its stream sequences out one after the other. A process
// that receives a sequence beyond the one it expects (its first, or one
// after another process served) may be missing revisions the server
// handed to a process that died: those come back only after the ack
// wait. Until nobody but this process holds a revision before it, the
// newer ones are held back, kept alive, and then passed on in the order
// of the stream.

// Bounds of the wait between two readings of the consumer while
// revisions are held back.
const (
	minRecheck = 100 * time.Millisecond
	maxRecheck = 2 * time.Second
)

// order keeps the revisions a process passes on in the order of the
// stream.
type order struct {
	// mu serialises handle and the release of held-back revisions; it
	// guards next, queue and stopping, and Service.last through decode.
	mu sync.Mutex
	// next is the stream sequence expected next; zero before the first.
	next uint64
	// queue holds the revisions held back, and seqs their stream
	// sequences, in increasing order.
	queue []heldBack
	seqs  []uint64
	// stopping is set once the process stops: revisions are no longer
	// held back, work hands them back.
	stopping bool
	// held is len(queue), for the metric and for settle.
	held atomic.Int64
	// wake asks hold to look at the consumer again.
	wake chan struct{}

	// acct guards unacked and settled; taken after mu, never before.
	acct sync.Mutex
	// unacked are the stream sequences this process received and has not
	// acknowledged, terminated or handed back: those the server counts as
	// pending because of it.
	unacked map[uint64]struct{}
	// settled counts the acknowledgements, terminations and hand-backs
	// sent.
	settled uint64
}

// heldBack is a revision held back.
type heldBack struct {
	msg  jetstream.Msg
	meta *jetstream.MsgMetadata
}

func newOrder() order {
	return order{wake: make(chan struct{}, 1), unacked: make(map[uint64]struct{})}
}

// settle records that the revision of stream sequence seq is
// acknowledged, terminated or handed back; call it before doing so.
func (s *Service) settle(seq uint64) {
	o := &s.order
	o.acct.Lock()
	delete(o.unacked, seq)
	o.settled++
	o.acct.Unlock()
	if o.held.Load() > 0 {
		o.poke()
	}
}

func (o *order) poke() {
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take receives a revision: it is passed on at once when it is the one
// expected (or one passed on before), else held back. It does not block
// on the server.
func (s *Service) take(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	o := &s.order
	seq := meta.Sequence.Stream
	o.mu.Lock()
	defer o.mu.Unlock()
	o.acct.Lock()
	o.unacked[seq] = struct{}{}
	o.acct.Unlock()
	now := o.stopping || len(o.queue) == 0 && o.next != 0 && seq <= o.next
	o.next = max(o.next, seq+1)
	if now {
		s.pass(msg, meta)
		return
	}
	i, found := slices.BinarySearch(o.seqs, seq)
	if found {
		// Handed out again while held back: keep the newer delivery.
		o.queue[i] = heldBack{msg, meta}
	} else {
		o.seqs = slices.Insert(o.seqs, i, seq)
		o.queue = slices.Insert(o.queue, i, heldBack{msg, meta})
	}
	o.held.Store(int64(len(o.queue)))
	o.poke()
}

// pass decodes a revision and hands its event to work, or acknowledges
// it when there is none. Call it with order.mu held, in stream order.
func (s *Service) pass(msg jetstream.Msg, meta *jetstream.MsgMetadata) {
	it := s.decode(msg, meta)
	if it == nil {
		s.settle(meta.Sequence.Stream)
		_ = msg.Ack()
		return
	}
	s.held.add(msg)
	s.in <- it
}

// hold runs beside consuming: while revisions are held back it reads the
// consumer, from a tenth of a second to two seconds apart and whenever
// something changes, and passes them on once nothing before them is
// pending elsewhere; it keeps them alive meanwhile. When the process
// stops it hands them back.
func (s *Service) hold(ctx context.Context) {
	o := &s.order
	keep := time.NewTicker(s.cfg.AckWait / 3)
	defer keep.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	delay := minRecheck
	for {
		select {
		case <-ctx.Done():
			o.mu.Lock()
			o.stopping = true
			for i, h := range o.queue {
				s.settle(o.seqs[i])
				_ = h.msg.Nak()
			}
			o.queue, o.seqs = nil, nil
			o.held.Store(0)
			o.mu.Unlock()
			return
		case <-keep.C:
			o.mu.Lock()
			for _, h := range o.queue {
				_ = h.msg.InProgress()
			}
			o.mu.Unlock()
			continue
		case <-o.wake:
			delay = minRecheck
		case <-retry.C:
		}
		if s.release(ctx) {
			retry.Reset(delay)
			delay = min(2*delay, maxRecheck, s.cfg.AckWait/3)
		}
	}
}

// release reads the consumer and passes on the revisions held back that
// may go: those no revision before is pending for, and all of them when
// the server counts no pending revision but this process's. It reports
// whether some are still held back.
func (s *Service) release(ctx context.Context) bool {
	o := &s.order
	if o.held.Load() == 0 {
		return false
	}
	js := s.js.Load()
	if js == nil {
		return true
	}
	o.acct.Lock()
	mine, before := uint64(len(o.unacked)), o.settled
	o.acct.Unlock()

	ctx, cancel := context.WithTimeout(ctx, max(s.cfg.Timeout, 5*time.Second))
	defer cancel()
	cons, err := (*js).Consumer(ctx, presence.FeedStream, s.cfg.Consumer)
	if err != nil {
		s.log.Debug("read the consumer to release held revisions", "err", err)
		return true
	}
	info := cons.CachedInfo()

	o.acct.Lock()
	during := o.settled - before
	o.acct.Unlock()
	// The server counts as pending every revision this process had
	// received and not settled when it was asked, but those settled since:
	// if it counts no more, no other process held one then. A revision
	// handed out since is left for the next reading.
	alone := uint64(info.NumAckPending)+during <= mine

	o.mu.Lock()
	defer o.mu.Unlock()
	for len(o.queue) > 0 {
		seq := o.seqs[0]
		if seq > info.AckFloor.Stream+1 && !(alone && seq <= info.Delivered.Stream) {
			break
		}
		h := o.queue[0]
		o.queue, o.seqs = o.queue[1:], o.seqs[1:]
		s.pass(h.msg, h.meta)
	}
	o.held.Store(int64(len(o.queue)))
	if len(o.queue) > 0 {
		s.log.Debug("revisions held back until those before them come again", "held", len(o.queue),
			"first_seq", o.seqs[0], "ack_floor", info.AckFloor.Stream, "ack_pending", info.NumAckPending)
	}
	return len(o.queue) > 0
}
