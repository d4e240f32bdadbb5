package main

import (
	"context"
	"fmt"
	"strings"
	"text/tabwriter"

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
			"changing --replicas. It is idempotent.",
		Flags:        concat(natsFlags(), logFlags()),
		OnUsageError: usageError,
		Action:       runBuckets,
	}
}

func runBuckets(c *cli.Context) error {
	log, buckets, err := processSetup(c)
	if err != nil {
		return err
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
	w := tabwriter.NewWriter(c.App.Writer, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "bucket\treplicas\thistory\tstorage\tkeys\tbytes")
	for _, name := range []string{presence.ConnsBucket, presence.StatusBucket, presence.GraphBucket} {
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
	return w.Flush()
}
