package client

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/greendot/greendot/pkg/presence"
	"github.com/greendot/greendot/pkg/protocol"
)

// Limits of one subscribe or unsubscribe message (docs/protocol.md).
const (
	MaxSubscribeIDs = 100
	MaxMessageBytes = 4096
)

// checkIDs checks user ids and drops repeats, keeping their order.
func checkIDs(userIDs []string) ([]string, error) {
	if len(userIDs) == 0 {
		return nil, errors.New("no user ids")
	}
	seen := make(map[string]struct{}, len(userIDs))
	ids := make([]string, 0, len(userIDs))
	for _, id := range userIDs {
		if !presence.ValidUserID(id) {
			return nil, fmt.Errorf("user id %q: want 1 to %d characters of A-Z a-z 0-9 _ -", id, presence.MaxUserIDLen)
		}
		if _, ok := seen[id]; !ok {
			seen[id] = struct{}{}
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// chunks splits ids into lists one message of type typ takes: at most
// MaxSubscribeIDs ids and MaxMessageBytes bytes of JSON (ids are ASCII).
func chunks(ids []string, typ string) [][]string {
	overhead := len(`{"type":"","id":"s-00000000000000000000","user_ids":[]}`) + len(typ)
	var out [][]string
	var cur []string
	size := overhead
	for _, id := range ids {
		add := len(id) + 3 // quotes and comma
		if len(cur) > 0 && (len(cur) >= MaxSubscribeIDs || size+add > MaxMessageBytes) {
			out = append(out, cur)
			cur, size = nil, overhead
		}
		cur = append(cur, id)
		size += add
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

// subscribeLocked sends subscribe messages for ids.
func (c *Client) subscribeLocked(ids []string) {
	for _, chunk := range chunks(ids, protocol.TypeSubscribe) {
		c.requestLocked(protocol.ClientMessage{Type: protocol.TypeSubscribe, ID: c.nextIDLocked(), UserIDs: chunk})
	}
}

// subscribeWindow is how many subscribes may wait for their answer at
// once: half of what the gateway takes, leaving room for the set_status
// messages that wait in the same queue.
const subscribeWindow = 8

// Subscribes and unsubscribes are sent at most requestRate a second after
// a burst of requestBurst: half of the gateway's default message rate
// limit, leaving the rest to heartbeats and status changes.
const (
	requestRate  = 10
	requestBurst = 20
)

// requestLocked queues a subscribe or unsubscribe for the open connection,
// after those before it, and sends what may go now.
func (c *Client) requestLocked(m protocol.ClientMessage) {
	if c.conn == nil {
		return
	}
	c.backlog = append(c.backlog, m)
	c.flushLocked()
}

// flushLocked sends the backlog's messages in order while the subscribes
// waiting for an answer and the rate leave room. When the rate stops it,
// a timer sends the rest later; an answer lets it go on (answeredLocked).
func (c *Client) flushLocked() {
	now := time.Now()
	c.tokens = min(requestBurst, c.tokens+now.Sub(c.refilled).Seconds()*requestRate)
	c.refilled = now
	for len(c.backlog) > 0 && c.conn != nil {
		next := c.backlog[0]
		if next.Type == protocol.TypeSubscribe && len(c.waiting) >= subscribeWindow {
			return
		}
		if c.tokens < 1 {
			if c.flushTimer == nil {
				wait := time.Duration((1 - c.tokens) / requestRate * float64(time.Second))
				c.timers.Add(1)
				c.flushTimer = time.AfterFunc(wait, c.flushLater)
			}
			return
		}
		c.tokens--
		c.backlog = c.backlog[1:]
		c.sendLocked(next)
		if next.Type == protocol.TypeSubscribe {
			c.waiting = append(c.waiting, next)
		}
	}
}

// flushLater is the timer's flush.
func (c *Client) flushLater() {
	defer c.timers.Done()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.flushTimer = nil
	c.flushLocked()
}

// answeredLocked takes the answer to the subscribe with this id: it and
// the ones sent before it are done, and the backlog may go on. It returns
// the subscribe, and false when id is none of them.
func (c *Client) answeredLocked(id string) (protocol.ClientMessage, bool) {
	i := slices.IndexFunc(c.waiting, func(m protocol.ClientMessage) bool { return m.ID == id })
	if id == "" || i < 0 {
		return protocol.ClientMessage{}, false
	}
	m := c.waiting[i]
	c.waiting = slices.Delete(c.waiting, 0, i+1)
	c.flushLocked()
	return m, true
}

func (c *Client) nextIDLocked() string {
	c.seq++
	return "s-" + strconv.FormatUint(c.seq, 10)
}
