package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/urfave/cli/v2"

	"github.com/greendot/greendot/pkg/natsconn"
	"github.com/greendot/greendot/pkg/presence"
)

func bucketsCommand() *cli.Command {
	return &cli.Command{
		Name:  "buckets",
		Usage: "create greendot's buckets, or bring their configuration up to date, and print their state",
		Description: "Every process creates the buckets it needs when they are missing, if its NATS user may create\n" +
			"streams. With the users of nats.conf only the operator may: run this once per deployment as the\n" +
			"operator, with the --replicas every process is given, before the processes start, and again after\n" +
			"changing --replicas. It is idempotent.\n\n" +
			"With --feed it also creates the stream presence_feed, which the webhooks processes consume: it\n" +
			"sources presence_status and keeps every revision for --feed-max-age, however many a user makes\n" +
			"(the bucket keeps 10 per user, and greendot's writers wait for the copy before they would drop one\n" +
			"not copied yet), so that a receiver outage shorter than that loses none. A writer that found no feed\n" +
			"looks for it again after a second: create it before the webhooks processes start.\n" +
			"It costs one more JetStream write per status change: create it only if webhooks run. --feed also\n" +
			"creates the bucket presence_webhook_resync, where the webhooks processes keep the users of their\n" +
			"dead letters until their current state is sent.",
		Flags: concat(natsFlags(), ownEnv("buckets",
			boolFlag(catProcess, "feed", "also create the stream presence_feed that greendot webhooks consume and their bucket presence_webhook_resync, or bring them up to date"),
			durationFlag(catProcess, "feed-max-age", presence.DefaultFeedMaxAge, "how long presence_feed keeps a revision (with --feed): the longest receiver outage that loses nothing; unless it is given, an existing feed keeps its own"),
		), logFlags()),
		OnUsageError: usageError,
		Action:       runBuckets,
	}
}

func runBuckets(c *cli.Context) error {
	log, buckets, err := processSetup(c)
	if err != nil {
		return err
	}
	feed := c.Bool("feed")
	if c.IsSet("feed-max-age") && !feed {
		return errors.New("--feed-max-age needs --feed")
	}
	// Without --feed-max-age, an existing feed keeps its max age.
	var maxAge time.Duration
	if c.IsSet("feed-max-age") {
		// Given, it must be a max age: 0 does not mean the feed's own.
		if maxAge = c.Duration("feed-max-age"); maxAge < presence.MinFeedMaxAge {
			return fmt.Errorf("--feed-max-age %v: want at least %v", maxAge, presence.MinFeedMaxAge)
		}
	}
	if _, err := presence.FeedConfig(buckets, maxAge); err != nil {
		return fmt.Errorf("--feed-max-age: %w", err)
	}
	nc, err := natsconn.Connect(natsOptions(c, "greendot buckets", log))
	if err != nil {
		return err
	}
	defer closeNATS(nc)
	ctx, cancel := context.WithTimeout(c.Context, graphTimeout)
	defer cancel()
	store, err := presence.Open(ctx, nc, buckets)
	if err != nil {
		return err
	}
	if feed {
		if err := presence.EnsureWebhooks(ctx, store.JetStream(), buckets, maxAge); err != nil {
			return err
		}
	}
	names := []string{presence.ConnsBucket, presence.LeasesBucket, presence.StatusBucket, presence.GraphBucket, presence.RoomsBucket, presence.TimersBucket}
	// The webhooks' bucket, when it exists.
	switch _, err := store.JetStream().KeyValue(ctx, presence.WebhookResyncBucket); {
	case err == nil:
		names = append(names, presence.WebhookResyncBucket)
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		return fmt.Errorf("bucket %q: %w", presence.WebhookResyncBucket, err)
	}
	w := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "bucket\treplicas\thistory\tstorage\tvalues\tbytes")
	for _, name := range names {
		kv, err := store.JetStream().KeyValue(ctx, name)
		if err != nil {
			return fmt.Errorf("bucket %q: %w", name, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return fmt.Errorf("bucket %q status: %w", name, err)
		}
		replicas, storage := 0, "?"
		if s, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			cfg := s.StreamInfo().Config
			replicas, storage = cfg.Replicas, strings.ToLower(cfg.Storage.String())
		}
		fmt.Fprintf(w, "%s\t%d\t%d\t%s\t%d\t%d\n", name, replicas, st.History(), storage, st.Values(), st.Bytes())
	}
	if err := w.Flush(); err != nil {
		return err
	}
	// The feed, when it exists: its max age, and how far its source is
	// behind presence_status.
	st, err := presence.Feed(ctx, store.JetStream())
	if errors.Is(err, presence.ErrFeedNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %q: %w", presence.FeedStream, err)
	}
	w = tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "\nstream\treplicas\tmax age\tstorage\tmessages\tbytes\tsource lag")
	lag := "?"
	if len(info.Sources) == 1 {
		lag = fmt.Sprint(info.Sources[0].Lag)
	}
	fmt.Fprintf(w, "%s\t%d\t%v\t%s\t%d\t%d\t%s\n", presence.FeedStream, info.Config.Replicas, info.Config.MaxAge,
		strings.ToLower(info.Config.Storage.String()), info.State.Msgs, info.State.Bytes, lag)
	return w.Flush()
}
