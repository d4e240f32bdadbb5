//go:build !linux

package netpoll

import "errors"

// Supported reports whether this platform has a Poller.
const Supported = false

// Poller is not available on this platform.
type Poller struct{}

var errUnsupported = errors.New("netpoll: not supported on this platform")

// New always fails on this platform.
func New() (*Poller, error) { return nil, errUnsupported }

// NewWritable always fails on this platform.
func NewWritable() (*Poller, error) { return nil, errUnsupported }

// Add always fails on this platform.
func (p *Poller) Add(fd int, tag uint64) error { return errUnsupported }

// Resume always fails on this platform.
func (p *Poller) Resume(fd int, tag uint64) error { return errUnsupported }

// Remove always fails on this platform.
func (p *Poller) Remove(fd int) error { return errUnsupported }

// Wait always fails on this platform.
func (p *Poller) Wait(dst []Event, msec int) ([]Event, error) { return dst, errUnsupported }

// Close does nothing on this platform.
func (p *Poller) Close() error { return nil }

// Release does nothing on this platform.
func (p *Poller) Release() error { return nil }

// ReadNow always fails on this platform.
func ReadNow(fd int, b []byte) (int, error) { return 0, errUnsupported }

// WriteNow always fails on this platform.
func WriteNow(fd int, b []byte) (int, error) { return 0, errUnsupported }
