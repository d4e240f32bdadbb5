package fanout

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/greendot/greendot/internal/durable"
	"github.com/greendot/greendot/pkg/metrics"
	"github.com/greendot/greendot/pkg/presence"
)

// Service is a fanout instance.
type Service struct {
	nc       *nats.Conn
	cfg      Config
	log      *slog.Logger
	consumer *durable.Consumer

	// sent holds, per user, the versions last published by this instance.
	// It is touched only by the consume callback, which runs on one
	// goroutine.
	sent map[string]versions
	// cached is len(sent), for the metrics.
	cached atomic.Int64

	reg     *prometheus.Registry
	metrics *fanoutMetrics
}

// versions are what this instance last published of a user: the record's
// public and self versions, and the revision they came from.
type versions struct{ pub, self, rev uint64 }

// New validates cfg and returns a fanout that will use nc. It starts no
// goroutines and does no I/O. The caller owns nc.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Service{
		nc:   nc,
		cfg:  cfg,
		log:  cfg.Logger.With("svc", "fanout"),
		sent: make(map[string]versions),
		reg:  metrics.NewRegistry(),
	}
	s.metrics = newFanoutMetrics(s.reg, s)
	consumer, err := durable.New(nc, durable.Config{
		Name:    "fanout",
		Logger:  s.log,
		Buckets: cfg.Buckets,
		Bucket:  presence.StatusBucket,
		Consumer: jetstream.ConsumerConfig{
			Durable:       presence.FanoutConsumer,
			Description:   "greendot fanout: status revisions to presence events",
			FilterSubject: presence.KeySubject(presence.StatusBucket, ">"),
			DeliverPolicy: jetstream.DeliverLastPerSubjectPolicy,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxAckPending: 10_000,
		},
		PullMaxMessages: 1000,
		Admin:           s.adminConfig(),
		NotReady:        ErrNotReady,
		Handle:          s.handle,
	})
	if err != nil {
		return nil, err
	}
	s.consumer = consumer
	return s, nil
}

// Run consumes status revisions until ctx is canceled, then stops
// consuming, finishes the revisions handed out, and returns nil. It
// returns an error only when the fanout cannot start.
func (s *Service) Run(ctx context.Context) error {
	return s.consumer.Run(ctx)
}

var statusSubjectPrefix = presence.KeySubject(presence.StatusBucket, "")

// handle publishes what one status revision means, then acknowledges it.
// The acknowledgement goes out on the same connection after the events, so
// if it reaches the server the events did too.
func (s *Service) handle(msg jetstream.Msg) {
	start := time.Now()
	defer func() { s.metrics.processing.Observe(time.Since(start).Seconds()) }()
	s.metrics.revisions.Inc()
	if err := s.process(msg); err != nil {
		s.metrics.failed.Inc()
		s.log.Error("fanout revision", "subject", msg.Subject(), "err", err)
		// Ask for redelivery later; a malformed record is acknowledged by
		// process instead, since retrying it cannot help.
		_ = msg.NakWithDelay(time.Second)
		return
	}
	_ = msg.Ack()
}

func (s *Service) process(msg jetstream.Msg) error {
	userID := strings.TrimPrefix(msg.Subject(), statusSubjectPrefix)
	if !presence.ValidUserID(userID) {
		s.metrics.ignored.WithLabelValues("invalid_key").Inc()
		s.log.Warn("ignoring status key that is not a user id", "subject", msg.Subject())
		return nil
	}
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("metadata: %w", err)
	}
	rev := meta.Sequence.Stream

	var rec presence.Record
	deleted := presence.EntryOp(msg.Headers()) != jetstream.KeyValuePut
	if !deleted {
		if err := json.Unmarshal(msg.Data(), &rec); err != nil {
			s.metrics.ignored.WithLabelValues("undecodable").Inc()
			s.log.Warn("ignoring undecodable status record", "user_id", userID, "err", err)
			return nil
		}
	}

	last, known := s.sent[userID]
	if known && rev <= last.rev {
		// Handled already, or older than a revision that was: delivered
		// again because an acknowledgement was lost. What it says is out
		// of date; publishing it would also set this memory back.
		s.metrics.ignored.WithLabelValues("stale").Inc()
		return nil
	}
	// A deleted record (an operator's `nats kv del`) makes the user offline
	// to everyone; its versions start over from zero (see below). Versions
	// lower than those published mean the same, seen by an instance that
	// did not handle the deletion.
	if deleted || !known || rec.PubVer > last.pub || rec.PubVer < last.pub {
		ev := presence.Event{UserID: userID, Status: presence.Offline, Rev: rev}
		if !deleted {
			ev.Status, ev.LastSeen, ev.At = rec.Public, rec.LastSeen, rec.Updated
			if ev.Status == "" {
				ev.Status = presence.Offline
			}
		}
		if err := s.publish(presence.EventSubject(userID), &ev); err != nil {
			return err
		}
		s.metrics.published.Inc()
		if ev.At != 0 {
			s.metrics.lag.Observe(time.Since(time.UnixMilli(ev.At)).Seconds())
		}
	} else {
		s.metrics.suppressed.Inc()
	}
	if !deleted && (!known || rec.SelfVer != last.self) {
		ev := presence.SelfEvent{UserID: userID, Status: rec.Status, Devices: rec.Devices, Rev: rev}
		for _, gw := range gateways(&rec) {
			if err := s.publish(presence.SelfSubject(gw), &ev); err != nil {
				return err
			}
			s.metrics.self.Inc()
		}
	}

	if len(s.sent) >= s.cfg.CacheSize {
		clear(s.sent)
	}
	if deleted {
		// Versions start over from zero in a record made again.
		s.sent[userID] = versions{rev: rev}
	} else {
		s.sent[userID] = versions{pub: rec.PubVer, self: rec.SelfVer, rev: rev}
	}
	s.cached.Store(int64(len(s.sent)))
	return nil
}

func (s *Service) publish(subject string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if err := s.nc.Publish(subject, data); err != nil {
		return fmt.Errorf("publish %s: %w", subject, err)
	}
	return nil
}

// gateways returns the distinct gateways holding a live (not closing)
// connection of the record's user.
func gateways(rec *presence.Record) []string {
	var out []string
	for _, c := range rec.Conns {
		if c.Closing || c.Gateway == "" {
			continue
		}
		dup := false
		for _, g := range out {
			if g == c.Gateway {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, c.Gateway)
		}
	}
	return out
}
