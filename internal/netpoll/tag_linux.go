//go:build linux

package netpoll

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// epoll_event's data is a 64-bit union that x/sys/unix exposes as the
// fields Fd and Pad (or Fd and the following bytes). The tag occupies those
// 8 bytes.

func setTag(ev *unix.EpollEvent, tag uint64) {
	*(*uint64)(unsafe.Pointer(&ev.Fd)) = tag
}

func tagOf(ev *unix.EpollEvent) uint64 {
	return *(*uint64)(unsafe.Pointer(&ev.Fd))
}
