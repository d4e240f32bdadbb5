package gateway

import (
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// TestWorkerPoolReuses: work handed one at a time is done by one worker,
// which stays for the next.
func TestWorkerPoolReuses(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var done atomic.Int32
		var states []*int
		p := newWorkerPool(4, func() *int {
			st := new(int)
			states = append(states, st)
			return st
		}, func(_ int, st *int) {
			*st++
			done.Add(1)
		})
		defer p.stop()
		for i := range 10 {
			p.run(i)
			synctest.Wait()
		}
		if done.Load() != 10 || p.size() != 1 || len(states) != 1 || *states[0] != 10 {
			t.Errorf("done %d with %d workers and %d states, want 10 with 1, its state used for all", done.Load(), p.size(), len(states))
		}
	})
}

// TestWorkerPoolBound: at most max workers work at once; more work waits
// for one to be free, and is then done.
func TestWorkerPoolBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var started, done atomic.Int32
		p := newWorkerPool(2, func() struct{} { return struct{}{} }, func(int, struct{}) {
			started.Add(1)
			<-release
			done.Add(1)
		})
		defer p.stop()
		p.run(1)
		p.run(2)
		handed := make(chan struct{})
		go func() {
			p.run(3)
			close(handed)
		}()
		synctest.Wait()
		select {
		case <-handed:
			t.Fatal("a third piece of work was taken while two workers were busy")
		default:
		}
		if started.Load() != 2 || p.size() != 2 {
			t.Fatalf("%d started with %d workers, want 2 with 2", started.Load(), p.size())
		}
		release <- struct{}{}
		<-handed
		close(release)
		synctest.Wait()
		if done.Load() != 3 || p.size() != 2 {
			t.Errorf("done %d with %d workers, want 3 with 2", done.Load(), p.size())
		}
	})
}

// TestWorkerPoolSweep: workers free for workerIdle end; a worker that
// worked since stays; new work starts a worker again.
func TestWorkerPoolSweep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var done atomic.Int32
		p := blockingPool(release, &done)
		defer p.stop()
		p.run(true)
		p.run(true)
		p.run(true)
		synctest.Wait()
		close(release)
		synctest.Wait()
		time.Sleep(workerIdle / 2)
		p.run(false) // the worker that became free last works again
		synctest.Wait()
		time.Sleep(workerIdle / 2)
		p.sweep(time.Now())
		if p.size() != 1 {
			t.Fatalf("%d workers after the sweep, want the 1 that worked since", p.size())
		}
		time.Sleep(workerIdle / 2)
		p.sweep(time.Now())
		if p.size() != 0 {
			t.Fatalf("%d workers after the second sweep, want none", p.size())
		}
		p.run(false)
		synctest.Wait()
		if done.Load() != 5 || p.size() != 1 {
			t.Errorf("done %d with %d workers, want 5 with 1", done.Load(), p.size())
		}
	})
}

// TestWorkerPoolStop: stop waits for work being done, ends every worker,
// and work handed after it is not done.
func TestWorkerPoolStop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var done atomic.Int32
		p := blockingPool(release, &done)
		p.run(false)
		p.run(true)
		synctest.Wait()
		stopped := make(chan struct{})
		go func() {
			p.stop()
			close(stopped)
		}()
		synctest.Wait()
		select {
		case <-stopped:
			t.Fatal("stop returned while a worker worked")
		default:
		}
		close(release)
		<-stopped
		if p.run(false) {
			t.Error("run took work after stop")
		}
		synctest.Wait()
		if done.Load() != 2 || p.size() != 0 {
			t.Errorf("done %d with %d workers, want 2 with 0", done.Load(), p.size())
		}
	})
}

// TestWorkerPoolKeep: of the workers that become free, the pool keeps
// at most keep; the others end at once, and with them their state.
func TestWorkerPoolKeep(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		var done, states atomic.Int32
		p := newWorkerPoolKeeping(8, 2, func() struct{} { states.Add(1); return struct{}{} }, func(block bool, _ struct{}) {
			if block {
				<-release
			}
			done.Add(1)
		})
		defer p.stop()
		for range 5 {
			if !p.run(true) {
				t.Fatal("run refused work before stop")
			}
		}
		synctest.Wait()
		if p.size() != 5 {
			t.Fatalf("%d workers for 5 pieces of blocked work, want 5", p.size())
		}
		close(release)
		synctest.Wait()
		if done.Load() != 5 || p.size() != 2 {
			t.Fatalf("done %d with %d workers, want 5 with the 2 kept", done.Load(), p.size())
		}
		for range 2 {
			p.run(false)
			synctest.Wait()
		}
		if done.Load() != 7 || p.size() != 2 || states.Load() != 5 {
			t.Errorf("done %d with %d workers and %d states, want 7 with the 2 kept and no new state", done.Load(), p.size(), states.Load())
		}
	})
}

// blockingPool returns a pool of 4 workers whose work, true or false, is
// counted in done once done, after release is closed when it is true.
func blockingPool(release <-chan struct{}, done *atomic.Int32) *workerPool[bool, struct{}] {
	return newWorkerPool(4, func() struct{} { return struct{}{} }, func(block bool, _ struct{}) {
		if block {
			<-release
		}
		done.Add(1)
	})
}
