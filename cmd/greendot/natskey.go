package main

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/nats-io/nkeys"
)

// natsKeyFile is the file, in a standalone's --data directory, that holds
// the seed of the one NKey its NATS server takes when dev auth is off:
// for the nats CLI's --nkey and the greendot commands' --nats-nkey.
const natsKeyFile = "nats.nk"

// natsKey returns the path of the NKey seed file in dir and the key's
// public part. The first time, when there is no such file, it makes the
// key and writes its seed there, readable by its owner only: whoever may
// read the store in dir may reach the server that keeps it. The caller
// holds dir's lock (lockData).
func natsKey(dir string) (path, public string, err error) {
	path = filepath.Join(dir, natsKeyFile)
	seed, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		seed, err = newNATSKey(path)
	}
	if err != nil {
		return "", "", fmt.Errorf("--data: NATS key: %w", err)
	}
	kp, err := nkeys.FromSeed(bytes.TrimSpace(seed))
	if err == nil {
		defer kp.Wipe()
		public, err = kp.PublicKey()
	}
	if err == nil && !nkeys.IsValidPublicUserKey(public) {
		err = errors.New("not the seed of a user key")
	}
	if err != nil {
		return "", "", fmt.Errorf("--data: %s holds no NKey seed (%v): remove it, and a new key is made", path, err)
	}
	return path, public, nil
}

// newNATSKey makes a user NKey and writes its seed to path, which must
// not exist, and returns the seed.
func newNATSKey(path string) ([]byte, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return nil, err
	}
	defer kp.Wipe()
	seed, err := kp.Seed()
	if err != nil {
		return nil, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, err
	}
	if _, err := f.Write(append(seed, '\n')); err != nil {
		_ = f.Close()
		return nil, err
	}
	return bytes.Clone(seed), f.Close() // Wipe clears seed
}
