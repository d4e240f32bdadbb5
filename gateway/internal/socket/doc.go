// Package socket is the transport of a gateway's WebSocket connections
// once upgraded: the frame decoder (Decoder) that turns the bytes a client
// sends into messages, fragments and control frames without holding
// memory between them, writes of one frame at a time that never wait for
// a slow peer (Conn), the rate limit of client frames (Limiter), and the
// close that RFC 6455 asks for: the close frame first, then the peer's
// (Conn.Close, Linger).
//
// It knows nothing of greendot's protocol: what a message means is the
// gateway's business.
package socket
