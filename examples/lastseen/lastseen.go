package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/greendot/greendot/pkg/signature"
	"github.com/greendot/greendot/webhook"
)

// Schema is the table the receiver keeps: one row per user, with the
// revision of the event it was last written from.
const Schema = `CREATE TABLE IF NOT EXISTS user_last_seen (
	user_id    text PRIMARY KEY,
	status     text NOT NULL,
	devices    integer NOT NULL,
	last_seen  timestamptz,
	revision   bigint NOT NULL,
	changed_at timestamptz NOT NULL
)`

// upsert writes an event unless the row already holds its revision or a
// newer one: a duplicate, or an older event delivered late, changes
// nothing. It returns the row's status before the write (NULL for a new
// row), and no row when it wrote nothing.
const upsert = `WITH before AS (SELECT status FROM user_last_seen WHERE user_id = $1)
INSERT INTO user_last_seen (user_id, status, devices, last_seen, revision, changed_at)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (user_id) DO UPDATE
	SET status = excluded.status, devices = excluded.devices, last_seen = excluded.last_seen,
	    revision = excluded.revision, changed_at = excluded.changed_at
	WHERE excluded.revision > user_last_seen.revision
RETURNING (SELECT status FROM before)`

// EnsureSchema creates the table if it is missing.
func EnsureSchema(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, Schema); err != nil {
		return fmt.Errorf("create table user_last_seen: %w", err)
	}
	return nil
}

// Apply writes a batch's events in one transaction, in their order, and
// returns the transitions among them: the events that changed a user's
// status. A duplicate, an event older than what the row holds, and one
// that repeats the status stored (with a newer revision, as the first
// event of a user after greendot's webhooks process restarted may) are
// not transitions; the last two still write the row when newer.
func Apply(ctx context.Context, pool *pgxpool.Pool, events []webhook.Event) ([]webhook.Event, error) {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("begin: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()

	var b pgx.Batch
	for _, ev := range events {
		var lastSeen *time.Time
		if ev.LastSeen != 0 {
			t := time.Unix(ev.LastSeen, 0)
			lastSeen = &t
		}
		b.Queue(upsert, ev.UserID, string(ev.Status), ev.Devices, lastSeen, int64(ev.Rev), time.UnixMilli(ev.At))
	}
	results := tx.SendBatch(ctx, &b)
	var transitions []webhook.Event
	for _, ev := range events {
		var before *string
		err := results.QueryRow().Scan(&before)
		if errors.Is(err, pgx.ErrNoRows) {
			continue // not newer than the row
		}
		if err != nil {
			_ = results.Close()
			return nil, fmt.Errorf("upsert %s@%d: %w", ev.UserID, ev.Rev, err)
		}
		if before == nil || *before != string(ev.Status) {
			transitions = append(transitions, ev)
		}
	}
	if err := results.Close(); err != nil {
		return nil, fmt.Errorf("upsert: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("commit: %w", err)
	}
	return transitions, nil
}

// maxBody bounds a delivery's body: greendot's batches are far smaller.
const maxBody = 4 << 20

// Handler receives greendot's webhook deliveries: it verifies each one's
// signature, writes its events into user_last_seen, and calls OnOffline
// for every user the batch turned offline.
type Handler struct {
	// Pool is the database.
	Pool *pgxpool.Pool
	// Secret is the key greendot signs with (its --secret).
	Secret []byte
	// Tolerance is how far a delivery's timestamp may be from now; zero
	// means signature.DefaultTolerance.
	Tolerance time.Duration
	// OnOffline, if set, is called once per user an event turned offline,
	// after the transaction committed: where a push notification ("alice
	// went offline") goes. A duplicate or late event never calls it, nor
	// one that repeats an offline already stored.
	OnOffline func(ctx context.Context, ev webhook.Event)
	// Logger receives the handler's logs; nil discards them.
	Logger *slog.Logger
}

// ServeHTTP answers 204 once the batch is stored, 401 to a delivery whose
// signature does not verify, 400 to one that is not a batch (greendot
// gives both up: dead letters), and 503 when the database fails (greendot
// retries).
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	log := h.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		http.Error(w, "body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	if err := signature.Verify(h.Secret, r.Header.Get(signature.Header), body, time.Now(), h.Tolerance); err != nil {
		log.Warn("delivery refused", "err", err, "remote", r.RemoteAddr)
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return
	}
	var batch webhook.Batch
	if err := json.Unmarshal(body, &batch); err != nil {
		http.Error(w, "not a batch of events: "+err.Error(), http.StatusBadRequest)
		return
	}
	for _, ev := range batch.Events {
		if ev.UserID == "" || ev.Rev == 0 || ev.Status == "" {
			http.Error(w, fmt.Sprintf("event %+v: want user_id, status and rev", ev), http.StatusBadRequest)
			return
		}
	}
	transitions, err := Apply(r.Context(), h.Pool, batch.Events)
	if err != nil {
		log.Error("store the batch", "err", err, "events", len(batch.Events))
		http.Error(w, "database unavailable", http.StatusServiceUnavailable)
		return
	}
	log.Debug("batch stored", "events", len(batch.Events), "transitions", len(transitions))
	if h.OnOffline != nil {
		for _, ev := range transitions {
			if ev.Status == "offline" {
				h.OnOffline(r.Context(), ev)
			}
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

// errNoSecret is main's error when the secret is missing.
var errNoSecret = errors.New("no secret: set LASTSEEN_WEBHOOK_SECRET to greendot's --secret")
