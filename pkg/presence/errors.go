package presence

import "errors"

// ErrInvalidStatus means a status string is not one a user may choose.
var ErrInvalidStatus = errors.New("invalid status")

// ErrInvalidUserID means a string is not a valid user id.
var ErrInvalidUserID = errors.New("invalid user id")

// ErrInvalidVisibility means a last-seen visibility setting is unknown.
var ErrInvalidVisibility = errors.New("invalid last_seen visibility")

// ErrNotFound means a key does not exist (or was deleted, purged or expired).
var ErrNotFound = errors.New("not found")

// ErrNoChange is returned by an UpdateStatus mutation to say that nothing
// needs to be written.
var ErrNoChange = errors.New("no change")

// ErrConflict means a compare-and-set write kept losing to other writers.
var ErrConflict = errors.New("too many write conflicts")

// ErrStoreReplaced means a bucket's stream is not the one the store opened:
// it was deleted and created again (NATS came back without its storage, an
// operator removed the bucket, a backup was restored). Its revisions started
// again, and a process that holds revisions from before compares them with
// unrelated ones, so Ready reports it until the process is restarted.
var ErrStoreReplaced = errors.New("bucket created again since this process opened it: its storage was lost or replaced; restart the process")
