package tooltest

import "io"

// SetTerminal has the lines of skips written to w, or to no terminal when
// w is nil, as if go test ran with -v when verbose is true, and forgets the
// lines written; it returns a function that restores all three.
func SetTerminal(w io.WriteCloser, isVerbose bool) (restore func()) {
	term, verb := terminal, verbose
	terminal = func() (io.WriteCloser, error) {
		if w == nil {
			return nil, io.ErrClosedPipe
		}
		return w, nil
	}
	verbose = func() bool { return isVerbose }
	said.Lock()
	msgs := said.msgs
	said.msgs = nil
	said.Unlock()
	return func() {
		terminal, verbose = term, verb
		said.Lock()
		said.msgs = msgs
		said.Unlock()
	}
}
