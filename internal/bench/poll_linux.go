//go:build linux

package bench

import (
	"errors"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// errEOF is readSocket's end of the stream.
var errEOF = errors.New("EOF")

// readSocket reads what the socket fd holds into b, without blocking: n
// bytes; 0 and nil when it holds nothing now; errEOF when the peer closed
// it; or the socket's error.
func readSocket(fd uintptr, b []byte) (int, error) {
	for {
		n, err := unix.Read(int(fd), b)
		switch {
		case err == unix.EINTR:
			continue
		case err == unix.EAGAIN:
			return 0, nil
		case err != nil:
			return 0, os.NewSyscallError("read", err)
		case n == 0:
			return 0, errEOF
		}
		return n, nil
	}
}

// setLingerZero makes closing nc reset it, leaving no TIME_WAIT.
func setLingerZero(nc net.Conn) {
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
		return
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptLinger(int(fd), unix.SOL_SOCKET, unix.SO_LINGER, &unix.Linger{Onoff: 1, Linger: 0})
	})
}
