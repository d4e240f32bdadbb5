package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/greendot/greendot/pkg/protocol"
)

// A connection's token is renewed in place: the gateway closes a socket
// whose token expired (1008 "token expired"), unless an auth message gave
// it a fresh one first. With Config.TokenFunc, renew asks for that fresh
// token when a third of the token's life is left and sends it on the open
// connection, so that the connection, its subscriptions and its rooms
// outlive the token. SetToken does the same with a token the caller gives.

// tokenLife is how long a token lasts: from when the client got it to its
// exp claim. The zero tokenLife is that of a token whose expiry is not
// known, which is not renewed in place.
type tokenLife struct {
	got, exp time.Time
}

// lifeOf returns the life of token, got at got: its exp claim, read
// without verifying the signature, which is the gateway's to verify. A
// token that is not a JWT, or has no exp, has the zero life.
func lifeOf(token string, got time.Time) tokenLife {
	var claims jwt.RegisteredClaims
	if _, _, err := jwt.NewParser().ParseUnverified(token, &claims); err != nil || claims.ExpiresAt == nil {
		return tokenLife{}
	}
	return tokenLife{got: got, exp: claims.ExpiresAt.Time}
}

// known reports whether the token's expiry is known.
func (l tokenLife) known() bool { return !l.exp.IsZero() }

// renewAt returns when to renew the token: when a third of its life is
// left. That leaves time to try again when getting a new one fails, and
// for a clock a little off the gateway's.
func (l tokenLife) renewAt() time.Time {
	return l.exp.Add(-l.exp.Sub(l.got) / 3)
}

// SetToken gives the client a fresh token, a JWT for the same user: it is
// sent on the open connection (an auth message), so that the connection
// outlives its first token, and later connections use it in place of
// Config.Token, unless Config.TokenFunc is set, which they call. The
// gateway closes the connection with 1008 when it refuses the token,
// which stops the client unless TokenFunc can give another one. A client
// with TokenFunc renews its tokens itself; SetToken is for a token got
// another way.
func (c *Client) SetToken(token string) error {
	if token == "" {
		return errors.New("set token: empty token")
	}
	got := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.err != nil:
		return fmt.Errorf("set token: %w", c.err)
	case c.cfg.User != "":
		return errors.New("set token: the client uses dev auth (Config.User), not tokens")
	}
	c.token = token
	if c.conn != nil {
		c.life = lifeOf(token, got)
		c.sendLocked(protocol.ClientMessage{Type: protocol.TypeAuth, Token: token})
		select {
		case c.tokenSet <- struct{}{}:
		default:
		}
	}
	return nil
}

// renew renews conn's token with TokenFunc until ctx ends: at the renewAt
// of the newest token sent on conn, it gets a fresh token and sends it in
// an auth message. Getting one that fails, or gives a token expiring no
// later than the one in use, is tried again after a backoff
// (Config.Backoff), as long as the try still comes before the token
// expires; after that, the gateway closes the connection (1008 "token
// expired") and the client reconnects with a fresh token. A token whose
// expiry is not known (not a JWT) is not renewed in place.
func (c *Client) renew(ctx context.Context, conn *Conn) {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	failures := 0
	var retry time.Time // when to try again after a failure
	for {
		life := c.tokenLife()
		at := life.renewAt()
		if failures > 0 {
			at = retry
		}
		var due <-chan time.Time
		if life.known() && at.Before(life.exp) {
			timer.Reset(time.Until(at))
			due = timer.C
		}
		select {
		case <-ctx.Done():
			return
		case <-c.tokenSet:
			// SetToken sent a token: its life decides from now on.
			timer.Stop()
			failures = 0
			continue
		case <-due:
		}
		err := c.renewOnce(ctx, conn, life)
		if err == nil {
			failures = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		retry = time.Now().Add(c.cfg.Backoff.Delay(failures))
		failures++
	}
}

// tokenLife returns the life of the newest token sent on the open
// connection.
func (c *Client) tokenLife() tokenLife {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.life
}

// renewOnce gets a fresh token from TokenFunc and sends it on conn, if
// conn is still the open connection and the token expires after old, the
// life of the token it renews.
func (c *Client) renewOnce(ctx context.Context, conn *Conn, old tokenLife) error {
	token, err := c.cfg.TokenFunc(ctx)
	switch {
	case err != nil:
		return fmt.Errorf("get token: %w", err)
	case token == "":
		return errors.New("get token: the token func returned an empty token")
	}
	life := lifeOf(token, time.Now())
	if life.known() && !life.exp.After(old.exp) {
		return fmt.Errorf("get token: the token func returned a token expiring at %v, no later than the one in use", life.exp)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conn != conn || c.life != old {
		// The connection ended, or SetToken sent a token meanwhile.
		return nil
	}
	c.life = life
	c.sendLocked(protocol.ClientMessage{Type: protocol.TypeAuth, Token: token})
	return nil
}
