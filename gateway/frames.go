package gateway

import (
	"encoding/json"
	"errors"
	"log/slog"

	"github.com/greendot/greendot/gateway/internal/hub"
	"github.com/greendot/greendot/pkg/protocol"
)

// frames writes protocol frames to connections, counted in the metrics
// by type. The gateway's parts that answer clients share it.
type frames struct {
	log     *slog.Logger
	metrics *gatewayMetrics
}

// sendError writes an error frame.
func (f frames) sendError(c *conn, id, code, message string) {
	f.send(c, protocol.TypeError, &protocol.Error{Type: protocol.TypeError, ID: id, Code: code, Message: message})
}

// sendDenied writes a denied frame.
func (f frames) sendDenied(c *conn, id, userID, reason string) {
	f.send(c, protocol.TypeDenied, &protocol.Denied{Type: protocol.TypeDenied, ID: id, UserID: userID, Reason: reason})
}

// send writes one frame of type typ.
func (f frames) send(c *conn, typ string, v any) {
	c.sock.Lock()
	defer c.sock.Unlock()
	_ = f.sendLocked(c, typ, v)
}

// errWriteFailed is sendLocked's error when the write failed (and ended
// the connection).
var errWriteFailed = errors.New("write to the socket failed")

// sendLocked writes one frame of type typ; the caller holds the socket's
// write lock. A failed write ends the connection.
func (f frames) sendLocked(c *conn, typ string, v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		f.log.Error("encode frame", "type", typ, "err", err)
		return err
	}
	if !c.writeLocked(data) {
		return errWriteFailed
	}
	f.metrics.msgsOut.WithLabelValues(typ).Inc()
	return nil
}

// reply answers a message whose NATS work failed with an unavailable
// error; it does nothing when err is nil.
func (f frames) reply(c *conn, id string, err error) {
	if err == nil || errors.Is(err, hub.ErrClosed) || !c.open() {
		return
	}
	f.log.Warn("request failed", "user_id", c.userID, "conn_id", c.connID, "err", err)
	f.sendError(c, id, protocol.CodeUnavailable, "presence state is unavailable right now; try again")
}
