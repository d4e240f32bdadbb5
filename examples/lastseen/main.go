// Command lastseen receives greendot's presence webhooks and keeps every
// user's status and last seen time in PostgreSQL, in the table
// user_last_seen. Events are applied idempotently and in revision order:
// a delivery sent twice, or an old event delivered late, changes nothing.
// When a user goes offline it logs where a push notification would be
// sent.
//
// Run it with the database's URL and the secret greendot signs with:
//
//	DATABASE_URL=postgres://app@localhost/app LASTSEEN_WEBHOOK_SECRET=... \
//	    go run ./examples/lastseen -listen 127.0.0.1:8090
//
// and point greendot at it, once the stream the webhooks read exists:
//
//	greendot buckets --feed
//	greendot webhooks --url http://127.0.0.1:8090/hooks/presence --secret-file secret
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/greendot/greendot/webhook"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8090", "address to serve POST /hooks/presence on")
	databaseURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL connection string (default $DATABASE_URL)")
	flag.Parse()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, *listen, *databaseURL, []byte(os.Getenv("LASTSEEN_WEBHOOK_SECRET")), log); err != nil {
		fmt.Fprintln(os.Stderr, "lastseen:", err)
		os.Exit(1)
	}
}

// run serves the receiver until ctx is canceled.
func run(ctx context.Context, listen, databaseURL string, secret []byte, log *slog.Logger) error {
	if len(secret) == 0 {
		return errNoSecret
	}
	if databaseURL == "" {
		return errors.New("no database: give -database-url or set DATABASE_URL")
	}
	pool, err := pgxpool.New(ctx, databaseURL) // -database-url, or DATABASE_URL
	if err != nil {
		return fmt.Errorf("database: %w", err)
	}
	defer pool.Close()
	if err := EnsureSchema(ctx, pool); err != nil {
		return err
	}
	mux := http.NewServeMux()
	mux.Handle("/hooks/presence", &Handler{Pool: pool, Secret: secret, OnOffline: pushOffline(log), Logger: log})
	srv := &http.Server{Addr: listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second, ReadTimeout: time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.ListenAndServe() }()
	log.Info("lastseen receiving", "addr", listen)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return srv.Shutdown(shutdown)
}

// pushOffline returns what is done when a user goes offline. An app would
// send a push notification here, to the user's contacts or to the user's
// own devices ("you were signed out everywhere"), through its push
// provider (FCM, APNs, Web Push); this example logs it. It runs after the
// event is stored, once per transition: a duplicate delivery does not call
// it again.
func pushOffline(log *slog.Logger) func(ctx context.Context, ev webhook.Event) {
	return func(_ context.Context, ev webhook.Event) {
		// Tell alice's contacts, or alice's other devices, through FCM,
		// APNs or Web Push. Keep it quick, or queue it: greendot waits
		// for the answer (--timeout) before it sends the next batch.
		log.Info("push: user went offline", "user_id", ev.UserID,
			"last_seen", time.Unix(ev.LastSeen, 0).UTC().Format(time.RFC3339), "rev", ev.Rev)
	}
}
