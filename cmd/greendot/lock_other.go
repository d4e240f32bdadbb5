//go:build !unix

package main

// lockDir does nothing where flock is not available: the caller must not
// run two standalone processes on one --data directory.
func lockDir(dir string) (unlock func(), err error) { return func() {}, nil }
