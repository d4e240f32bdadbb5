package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// workerHandle is the orchestrator's end of one worker.
type workerHandle struct {
	k       int
	enc     *json.Encoder
	in      io.Closer
	replies chan Reply
	done    chan struct{} // closed when the worker has exited
	cmd     *exec.Cmd     // nil for an in-process worker
	log     string        // the worker process's stderr
	mu      sync.Mutex
	readErr error
}

// pid returns the worker process's id, or 0 for an in-process worker.
func (h *workerHandle) pid() int {
	if h.cmd == nil || h.cmd.Process == nil {
		return 0
	}
	return h.cmd.Process.Pid
}

// startWorkers starts cfg.Workers workers: processes of cfg.Worker
// ("greendot-bench worker"), or goroutines with InProcessWorkers.
func startWorkers(ctx context.Context, cfg *Config, dir string) ([]*workerHandle, error) {
	var hs []*workerHandle
	for k := range cfg.Workers {
		h := &workerHandle{k: k, replies: make(chan Reply, 4), done: make(chan struct{})}
		var out io.Reader
		if cfg.InProcessWorkers {
			cmdR, cmdW := io.Pipe()
			repR, repW := io.Pipe()
			h.enc, h.in, out = json.NewEncoder(cmdW), cmdW, repR
			go func() {
				defer close(h.done)
				err := RunWorker(ctx, cmdR, repW)
				_ = cmdR.Close()
				if err == nil {
					err = io.EOF
				}
				_ = repW.CloseWithError(err)
			}()
		} else {
			h.log = filepath.Join(dir, fmt.Sprintf("worker-%d.log", k))
			f, err := os.Create(h.log)
			if err != nil {
				stopWorkers(hs)
				return nil, err
			}
			cmd := exec.Command(cfg.Worker[0], cfg.Worker[1:]...)
			cmd.Env = childEnv()
			cmd.Stderr = f
			stdin, err := cmd.StdinPipe()
			if err != nil {
				_ = f.Close()
				stopWorkers(hs)
				return nil, err
			}
			stdout, err := cmd.StdoutPipe()
			if err != nil {
				_ = f.Close()
				stopWorkers(hs)
				return nil, err
			}
			if err := cmd.Start(); err != nil {
				_ = f.Close()
				stopWorkers(hs)
				return nil, fmt.Errorf("%w: start worker %d: %v", ErrWorker, k, err)
			}
			h.cmd, h.enc, h.in, out = cmd, json.NewEncoder(stdin), stdin, stdout
			go func() {
				defer close(h.done)
				<-h.readerDone(out)
				_ = cmd.Wait()
				_ = f.Close()
			}()
			hs = append(hs, h)
			continue
		}
		h.readerDone(out)
		hs = append(hs, h)
	}
	return hs, nil
}

// readerDone starts reading replies from out and returns a channel closed
// when out ends.
func (h *workerHandle) readerDone(out io.Reader) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer close(h.replies)
		dec := json.NewDecoder(out)
		for {
			var r Reply
			if err := dec.Decode(&r); err != nil {
				h.mu.Lock()
				h.readErr = err
				h.mu.Unlock()
				return
			}
			h.replies <- r
		}
	}()
	return done
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
	if h.log != "" {
		if b, rerr := os.ReadFile(h.log); rerr == nil && len(b) > 0 {
			s := strings.TrimSpace(string(b))
			if len(s) > 2000 {
				s = "..." + s[len(s)-2000:]
			}
			msg += ": " + s
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
// waits for them, killing a process that does not end in time.
func stopWorkers(hs []*workerHandle) {
	var wg sync.WaitGroup
	for _, h := range hs {
		wg.Go(func() {
			_ = h.enc.Encode(Command{Op: OpClose})
			_ = h.in.Close()
			select {
			case <-h.done:
			case <-time.After(30 * time.Second):
				if h.cmd != nil && h.cmd.Process != nil {
					_ = h.cmd.Process.Kill()
					<-h.done
				}
			}
		})
	}
	wg.Wait()
}
