package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/greendot/greendot/system"
)

// workerHandle is the orchestrator's end of one worker.
type workerHandle struct {
	k       int
	enc     *json.Encoder
	in      io.Closer
	replies chan Reply
	done    chan struct{}                // closed when the worker has ended and replies is closed
	proc    atomic.Pointer[system.Child] // nil for an in-process worker
	mu      sync.Mutex
	readErr error
}

// pid returns the worker process's id, or 0 for an in-process worker.
func (h *workerHandle) pid() int {
	if p := h.proc.Load(); p != nil {
		return p.Pid()
	}
	return 0
}

// startWorkers starts cfg.Workers workers, their logs in dir: processes of
// cfg.Worker ("greendot-bench worker"), or goroutines with
// InProcessWorkers.
func startWorkers(ctx context.Context, cfg *Config, dir string) ([]*workerHandle, error) {
	var hs []*workerHandle
	for k := range cfg.Workers {
		h := &workerHandle{k: k, replies: make(chan Reply, 4), done: make(chan struct{})}
		if cfg.InProcessWorkers {
			h.runInProcess(ctx)
			hs = append(hs, h)
			continue
		}
		proc, err := system.StartChild(system.ChildOptions{
			Name:     fmt.Sprintf("worker %d", k),
			Path:     cfg.Worker[0],
			Args:     cfg.Worker[1:],
			Env:      childEnv(),
			Log:      filepath.Join(dir, fmt.Sprintf("worker-%d.log", k)),
			Stdin:    true,
			OnStdout: h.take,
		})
		if err != nil {
			stopWorkers(hs)
			return nil, fmt.Errorf("%w: %v", ErrWorker, err)
		}
		h.proc.Store(proc)
		h.enc, h.in = json.NewEncoder(proc.Stdin()), proc.Stdin()
		go func() {
			defer close(h.done)
			<-proc.Done()
			close(h.replies)
		}()
		hs = append(hs, h)
	}
	return hs, nil
}

// runInProcess runs the worker as goroutines of this process, talking
// over pipes.
func (h *workerHandle) runInProcess(ctx context.Context) {
	cmdR, cmdW := io.Pipe()
	repR, repW := io.Pipe()
	h.enc, h.in = json.NewEncoder(cmdW), cmdW
	var wg sync.WaitGroup
	wg.Go(func() {
		err := RunWorker(ctx, cmdR, repW)
		_ = cmdR.Close()
		if err == nil {
			err = io.EOF
		}
		_ = repW.CloseWithError(err)
	})
	wg.Go(func() {
		defer close(h.replies)
		dec := json.NewDecoder(repR)
		for {
			var r Reply
			if err := dec.Decode(&r); err != nil {
				h.failed(err)
				return
			}
			h.replies <- r
		}
	})
	go func() {
		defer close(h.done)
		wg.Wait()
	}()
}

// take decodes one reply line of a worker process. A line that is not a
// reply ends the worker: the orchestrator cannot follow it any more.
func (h *workerHandle) take(line []byte) {
	var r Reply
	if err := json.Unmarshal(line, &r); err != nil {
		h.failed(fmt.Errorf("reply %.200q: %w", line, err))
		if p := h.proc.Load(); p != nil {
			p.Signal(syscall.SIGKILL)
		}
		return
	}
	h.replies <- r
}

// failed records why the worker's replies ended.
func (h *workerHandle) failed(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.readErr == nil {
		h.readErr = err
	}
}

// failure describes why a worker stopped answering.
func (h *workerHandle) failure() string {
	h.mu.Lock()
	err := h.readErr
	h.mu.Unlock()
	msg := fmt.Sprintf("worker %d stopped", h.k)
	if err != nil && !errors.Is(err, io.EOF) {
		msg += fmt.Sprintf(" (%v)", err)
	}
	if p := h.proc.Load(); p != nil {
		if tail := p.Tail(); tail != "" {
			msg += ": " + tail
		}
	}
	return msg
}

// send writes a command to every worker; cmd builds each one's.
func send(hs []*workerHandle, cmd func(k int) Command) error {
	for _, h := range hs {
		if err := h.enc.Encode(cmd(h.k)); err != nil {
			return fmt.Errorf("%w: %s: %v", ErrWorker, h.failure(), err)
		}
	}
	return nil
}

// collect waits for every worker's reply to op, up to timeout.
func collect(ctx context.Context, hs []*workerHandle, op string, timeout time.Duration) ([]Reply, error) {
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	out := make([]Reply, len(hs))
	for i, h := range hs {
		select {
		case r, ok := <-h.replies:
			if !ok {
				return nil, fmt.Errorf("%w: %s during %s", ErrWorker, h.failure(), op)
			}
			if r.Op != op {
				return nil, fmt.Errorf("%w: worker %d answered %q to %q", ErrWorker, h.k, r.Op, op)
			}
			if r.Err != "" {
				return nil, fmt.Errorf("%w: worker %d: %s: %s", ErrWorker, h.k, op, r.Err)
			}
			out[i] = r
		case <-timer.C:
			return nil, fmt.Errorf("%w: worker %d did not finish %s within %v", ErrWorker, h.k, op, timeout)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return out, nil
}

// call sends a command to every worker and collects the replies.
func call(ctx context.Context, hs []*workerHandle, timeout time.Duration, cmd func(k int) Command) ([]Reply, error) {
	if len(hs) == 0 {
		return nil, nil
	}
	op := cmd(0).Op
	if err := send(hs, cmd); err != nil {
		return nil, err
	}
	return collect(ctx, hs, op, timeout)
}

// stopWorkers asks every worker to close its connections and end, and
// waits for them, killing a process that does not end in 30s.
func stopWorkers(hs []*workerHandle) {
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Go(func() {
			_ = h.enc.Encode(Command{Op: OpClose})
			_ = h.in.Close()
			// Replies nobody waits for any more are dropped, so that
			// reading them never holds the worker's end up.
			replies := h.replies
			kill := time.NewTimer(30 * time.Second)
			defer kill.Stop()
			for {
				select {
				case <-h.done:
					return
				case _, ok := <-replies:
					if !ok {
						replies = nil
					}
				case <-kill.C:
					if p := h.proc.Load(); p != nil {
						p.Signal(syscall.SIGKILL)
					}
				}
			}
		})
	}
	wg.Wait()
}
