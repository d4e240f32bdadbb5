package system

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tailBytes is how much of a child's log Tail returns at most.
const tailBytes = 2000

// ChildOptions says how to run a child process.
type ChildOptions struct {
	// Name names the process in errors and in the lines Echo receives.
	Name string
	// Path is the executable, such as a greendot binary.
	Path string
	// Args are its arguments, without the program's name.
	Args []string
	// Env is its environment; nil means this process's.
	Env []string
	// Kind decides when a System's Stop stops it: gateways first.
	Kind Kind
	// StopSignal is what a System's Stop ends it with; zero means SIGTERM.
	StopSignal syscall.Signal
	// Log, when set, is a file that receives the process's stderr, and its
	// stdout unless OnStdout is set. It is appended to, so a process
	// started again adds to it. Without Log, the lines of stderr are kept
	// in memory (Lines) and stdout is discarded unless OnStdout is set.
	Log string
	// Echo, when set and Log is not, receives every line of stderr too,
	// after "[Name] ".
	Echo io.Writer
	// Stdin gives the process a pipe on its standard input (Child.Stdin);
	// otherwise it reads from the null device.
	Stdin bool
	// OnStdout, when set, is called with every line the process writes on
	// stdout, without its newline, in order, from one goroutine.
	OnStdout func(line []byte)
}

// Child is a child process, made by StartChild or System.StartChild. It
// owns the goroutines that read its output and wait for it; they end when
// the process has exited. Its methods are safe for concurrent use.
type Child struct {
	opts   ChildOptions
	onExit func() // set by a System before the start

	mu    sync.Mutex
	cmd   *exec.Cmd
	stdin io.WriteCloser
	done  chan struct{} // closed when the process has exited
	err   error         // its exit error; set before done is closed
	lines []string      // its stderr, without Log
}

// StartChild starts a child process.
func StartChild(opts ChildOptions) (*Child, error) {
	c := &Child{opts: opts}
	if err := c.Start(); err != nil {
		return nil, err
	}
	return c, nil
}

// Start starts the process; once it has exited, Start starts it again with
// the same options. It fails while the process runs.
func (c *Child) Start() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done != nil && !closed(c.done) {
		return fmt.Errorf("start %s: it runs", c.opts.Name)
	}
	cmd := exec.Command(c.opts.Path, c.opts.Args...)
	cmd.Env = c.opts.Env
	var (
		logFile *os.File
		readers []func()
	)
	fail := func(err error) error {
		if logFile != nil {
			_ = logFile.Close()
		}
		return fmt.Errorf("start %s: %w", c.opts.Name, err)
	}
	if c.opts.Log != "" {
		f, err := os.OpenFile(c.opts.Log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fail(err)
		}
		logFile, cmd.Stderr = f, f
		if c.opts.OnStdout == nil {
			cmd.Stdout = f
		}
	} else {
		stderr, err := cmd.StderrPipe()
		if err != nil {
			return fail(err)
		}
		readers = append(readers, func() { eachLine(stderr, c.keep) })
	}
	if on := c.opts.OnStdout; on != nil {
		stdout, err := cmd.StdoutPipe()
		if err != nil {
			return fail(err)
		}
		readers = append(readers, func() { eachLine(stdout, on) })
	}
	var stdin io.WriteCloser
	if c.opts.Stdin {
		var err error
		if stdin, err = cmd.StdinPipe(); err != nil {
			return fail(err)
		}
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	done := make(chan struct{})
	c.cmd, c.stdin, c.done, c.err = cmd, stdin, done, nil
	go func() {
		// The pipes are read to their end before Wait closes them.
		var wg sync.WaitGroup
		for _, read := range readers {
			wg.Go(read)
		}
		wg.Wait()
		err := cmd.Wait()
		if logFile != nil {
			_ = logFile.Close()
		}
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		if c.onExit != nil {
			c.onExit()
		}
		close(done)
	}()
	return nil
}

// keep records a line of stderr.
func (c *Child) keep(line []byte) {
	if c.opts.Echo != nil {
		_, _ = fmt.Fprintf(c.opts.Echo, "[%s] %s\n", c.opts.Name, line)
	}
	c.mu.Lock()
	c.lines = append(c.lines, string(line))
	c.mu.Unlock()
}

// eachLine calls f with every line read from r, without its newline,
// until r ends.
func eachLine(r io.Reader, f func([]byte)) {
	br := bufio.NewReaderSize(r, 64<<10)
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			f(bytes.TrimSuffix(line, []byte("\n")))
		}
		if err != nil {
			return
		}
	}
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// Name returns the process's name.
func (c *Child) Name() string { return c.opts.Name }

// Kind returns the process's kind.
func (c *Child) Kind() Kind { return c.opts.Kind }

// Pid returns the process id of the newest start.
func (c *Child) Pid() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cmd.Process.Pid
}

// Stdin returns the pipe to the standard input of the newest start, or nil
// without ChildOptions.Stdin. Closing it ends the process's input; it is
// closed when the process has exited.
func (c *Child) Stdin() io.WriteCloser {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stdin
}

// Done returns a channel closed when the newest start has exited.
func (c *Child) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.done
}

// Exited reports whether the process has exited, and its exit error.
func (c *Child) Exited() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !closed(c.done) {
		return false, nil
	}
	return true, c.err
}

// Signal sends sig to the process, if it runs.
func (c *Child) Signal(sig os.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !closed(c.done) {
		_ = c.cmd.Process.Signal(sig)
	}
}

// Wait waits up to timeout for the process to exit and returns its exit
// error, or an error wrapping ErrTimeout.
func (c *Child) Wait(timeout time.Duration) error {
	done := c.Done()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-done:
		_, err := c.Exited()
		return err
	case <-timer.C:
		return fmt.Errorf("%s did not exit within %v: %w", c.opts.Name, timeout, ErrTimeout)
	}
}

// Stop sends sig to the process and waits up to timeout (zero means
// DefaultStopTimeout) for it to exit, then kills it. It returns nil when
// the process exited on sig or with status 0, its exit error otherwise
// (also when it had exited before), or an error wrapping ErrTimeout when
// it had to be killed.
func (c *Child) Stop(sig syscall.Signal, timeout time.Duration) error {
	if done, err := c.Exited(); done {
		return err
	}
	timeout = cmp.Or(timeout, DefaultStopTimeout)
	c.Signal(sig)
	err := c.Wait(timeout)
	if errors.Is(err, ErrTimeout) {
		c.Signal(syscall.SIGKILL)
		<-c.Done()
		return fmt.Errorf("%s did not exit within %v of %v, and was killed: %w", c.opts.Name, timeout, sig, ErrTimeout)
	}
	if exitedOn(err, sig) {
		return nil
	}
	return err
}

// Kill ends the process with SIGKILL and waits until it has exited.
func (c *Child) Kill() error {
	return c.Stop(syscall.SIGKILL, DefaultStopTimeout)
}

// exitedOn reports whether err says that a process ended on sig.
func exitedOn(err error, sig syscall.Signal) bool {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return false
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// Lines returns the lines of stderr kept so far, without ChildOptions.Log.
func (c *Child) Lines() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// Tail returns the end of the process's log (its Log file, or the lines
// kept), at most about 2000 bytes, for an error message.
func (c *Child) Tail() string {
	var s string
	if c.opts.Log != "" {
		b, err := os.ReadFile(c.opts.Log)
		if err != nil {
			return ""
		}
		s = string(b)
	} else {
		s = strings.Join(c.Lines(), "\n")
	}
	s = strings.TrimSpace(s)
	if len(s) > tailBytes {
		s = "..." + s[len(s)-tailBytes:]
	}
	return s
}
