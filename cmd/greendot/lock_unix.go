//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
)

// lockFile is the file in --data that one standalone process at a time
// holds locked.
const lockFile = "greendot.lock"

// lockDir takes an exclusive lock on dir, so that two standalone processes
// never run JetStream on one store. The lock ends with the returned
// function, or with the process.
func lockDir(dir string) (unlock func(), err error) {
	path := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--data: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("--data %s is in use by another greendot standalone process (it holds %s)", dir, path)
		}
		return nil, fmt.Errorf("--data: lock %s: %w", path, err)
	}
	return func() { _ = f.Close() }, nil
}
