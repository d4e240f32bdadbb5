package presence_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/pkg/presence"
)

// statusReads counts the reads of presence_status records that nc's
// server is asked for: direct gets and reads from the stream leader.
type statusReads struct{ direct, leader atomic.Int64 }

func countStatusReads(t *testing.T, nc *nats.Conn) *statusReads {
	t.Helper()
	var n statusReads
	stream := presence.StreamName(presence.StatusBucket)
	for subj, c := range map[string]*atomic.Int64{
		"$JS.API.DIRECT.GET." + stream + ".>": &n.direct,
		"$JS.API.STREAM.MSG.GET." + stream:    &n.leader,
	} {
		sub, err := nc.Subscribe(subj, func(*nats.Msg) { c.Add(1) })
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return &n
}

// want checks the reads counted since the last check. The server hands a
// copy of a request to the counter in its own time (a leader read's after
// it queued the request for the JetStream API), so want waits for the
// counts to reach what it wants, and a count over it shows then or at the
// next check.
func (n *statusReads) want(t *testing.T, nc *nats.Conn, direct, leader int64, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n.direct.Load() >= direct && n.leader.Load() >= leader {
			break
		}
	}
	if d, l := n.direct.Swap(0), n.leader.Swap(0); d != direct || l != leader {
		t.Errorf("%s: %d direct gets and %d leader reads, want %d and %d", what, d, l, direct, leader)
	}
}

func addConn(id string) func(*presence.Record) error {
	return func(r *presence.Record) error {
		r.SetConn(id, presence.ConnInfo{Gateway: "g", Lease: "e"})
		return nil
	}
}

// TestWriteStatusReadsDirect: a store that reads direct (the gateway's)
// reads a record it has no copy of with a direct get, and goes to the
// stream leader when that read led nowhere: it said there was nothing to
// change, or a write from it lost. A store that does not (the reaper's)
// reads from the leader.
func TestWriteStatusReadsDirect(t *testing.T) {
	srv := natstest.RunServer(t)
	nc := natstest.Connect(t, srv)
	ctx := context.Background()
	st, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st.ReadDirect()
	spy := natstest.Connect(t, srv)
	reads := countStatusReads(t, spy)

	w, err := st.WriteStatus(ctx, "ann", &presence.Cached{}, addConn("c1"))
	if err != nil || !w.Written {
		t.Fatalf("first write: %+v, %v", w, err)
	}
	reads.want(t, spy, 1, 0, "a user with no record")

	w, err = st.WriteStatus(ctx, "ann", &presence.Cached{}, addConn("c2"))
	if err != nil || !w.Written || len(w.Next.Conns) != 2 {
		t.Fatalf("second write: %+v, %v", w, err)
	}
	reads.want(t, spy, 1, 0, "a user with a record")

	w, err = st.WriteStatus(ctx, "ann", &presence.Cached{}, func(*presence.Record) error { return presence.ErrNoChange })
	if err != nil || w.Written || w.Rev == 0 {
		t.Fatalf("no change: %+v, %v", w, err)
	}
	reads.want(t, spy, 1, 1, "nothing to change, confirmed by the leader")

	// A copy made before another writer wrote loses its compare-and-set:
	// the record is read again from the leader, not with a direct get.
	var stale presence.Cached
	if _, err := st.WriteStatus(ctx, "ann", &stale, addConn("c3")); err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriteStatus(ctx, "ann", &presence.Cached{}, addConn("c4")); err != nil {
		t.Fatal(err)
	}
	reads.want(t, spy, 2, 0, "two writes from no copy")
	w, err = st.WriteStatus(ctx, "ann", &stale, addConn("c5"))
	if err != nil || !w.Written || len(w.Next.Conns) != 5 {
		t.Fatalf("write from a stale copy: %+v, %v", w, err)
	}
	reads.want(t, spy, 0, 1, "a copy that lost")

	// A deleted record reads as missing at its marker's revision, and is
	// written again over the marker.
	if err := st.DeleteStatus(ctx, "ann"); err != nil {
		t.Fatal(err)
	}
	w, err = st.WriteStatus(ctx, "ann", &presence.Cached{}, addConn("c6"))
	if err != nil || !w.Written || len(w.Next.Conns) != 1 {
		t.Fatalf("write over a delete marker: %+v, %v", w, err)
	}
	reads.want(t, spy, 1, 0, "a deleted record")

	plain, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.WriteStatus(ctx, "bo", &presence.Cached{}, addConn("c1")); err != nil {
		t.Fatal(err)
	}
	reads.want(t, spy, 0, 1, "a store that does not read direct")
}

// TestWriteStatusStaleDirectRead: a direct get answered by a replica that
// lags (here a responder of the test's, on a bucket whose server answers
// no direct gets) never leads to a wrong write: a write from its old
// revision loses its compare-and-set, and its "nothing to change" is asked
// of the leader, whose record then has the connection taken out.
func TestWriteStatusStaleDirectRead(t *testing.T) {
	st, nc := openStore(t, presence.BucketOptions{})
	st.ReadDirect()
	ctx := context.Background()
	// The lagging replica will know only this first revision, with no
	// connection.
	first, err := st.WriteStatus(ctx, "cy", &presence.Cached{}, func(r *presence.Record) error {
		r.Chosen = presence.Busy
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	old, err := bucketKV(t, st, presence.StatusBucket).Get(ctx, presence.StatusKey("cy"))
	if err != nil {
		t.Fatal(err)
	}
	js := st.JetStream()
	stream := presence.StreamName(presence.StatusBucket)
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.AllowDirect = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	answered := atomic.Int64{}
	sub, err := nc.Subscribe("$JS.API.DIRECT.GET."+stream+".>", func(m *nats.Msg) {
		answered.Add(1)
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set("Nats-Stream", stream)
		reply.Header.Set("Nats-Subject", m.Subject[len("$JS.API.DIRECT.GET."+stream+"."):])
		reply.Header.Set("Nats-Sequence", strconv.FormatUint(old.Revision(), 10))
		reply.Data = old.Value()
		_ = m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if _, err := st.WriteStatus(ctx, "cy", &presence.Cached{}, addConn("c1")); err != nil {
		t.Fatal(err)
	}
	_, rev, err := st.Status(ctx, "cy")
	if err != nil || rev <= first.Rev {
		t.Fatalf("after the write over a stale answer: rev %d (first %d), %v", rev, first.Rev, err)
	}

	// Taking c1 out: the stale answer has no c1, so "nothing to change";
	// the leader's record has it.
	w, err := st.WriteStatus(ctx, "cy", &presence.Cached{}, func(r *presence.Record) error {
		if _, ok := r.Conns["c1"]; !ok {
			return presence.ErrNoChange
		}
		r.RemoveConn("c1", time.Now().UnixMilli())
		return nil
	})
	if err != nil || !w.Written {
		t.Fatalf("removal over a stale answer: %+v, %v", w, err)
	}
	rec, _, err := st.Status(ctx, "cy")
	if err != nil || len(rec.Conns) != 0 || rec.Chosen != presence.Busy {
		t.Errorf("record after the removal: %+v, %v; want no connection, busy kept", rec, err)
	}
	if answered.Load() != 2 {
		t.Errorf("the lagging replica answered %d direct gets, want 2", answered.Load())
	}
}

// TestWriteStatusDirectRefused: a user whose permissions refuse direct
// gets of presence_status (an older permissions file) still writes, read
// from the leader, and does not try a direct get again for a while.
func TestWriteStatusDirectRefused(t *testing.T) {
	srv := natstest.RunServerWithOptions(t, &server.Options{Users: []*server.User{{
		Username: "u", Password: "p",
		Permissions: &server.Permissions{Publish: &server.SubjectPermission{
			Allow: []string{">"},
			Deny:  []string{"$JS.API.DIRECT.GET." + presence.StreamName(presence.StatusBucket) + ".>"},
		}},
	}, {Username: "spy", Password: "p"}}})
	nc := natstest.Connect(t, srv, nats.UserInfo("u", "p"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	ctx := context.Background()
	st, err := presence.Open(ctx, nc, presence.BucketOptions{})
	if err != nil {
		t.Fatal(err)
	}
	st.ReadDirect()
	spy := natstest.Connect(t, srv, nats.UserInfo("spy", "p"))
	reads := countStatusReads(t, spy)
	for i, u := range []string{"a", "b"} {
		w, err := st.WriteStatus(ctx, u, &presence.Cached{}, addConn("c1"))
		if err != nil || !w.Written {
			t.Fatalf("write %d: %+v, %v", i, w, err)
		}
	}
	// The refused request never reaches a subscriber: the leader read
	// after it, and the next write's, do.
	reads.want(t, spy, 0, 2, "two writes with direct gets refused")
}
