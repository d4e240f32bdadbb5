package gateway

import "log/slog"

const levelDebug = slog.LevelDebug

// Log attributes, with the keys greendot's logs share.
func attrUser(id string) slog.Attr  { return slog.String("user_id", id) }
func attrConn(id string) slog.Attr  { return slog.String("conn_id", id) }
func attrErr(err error) slog.Attr   { return slog.Any("err", err) }
func attrReason(r string) slog.Attr { return slog.String("reason", r) }
func attrCode(code int) slog.Attr   { return slog.Int("code", code) }
