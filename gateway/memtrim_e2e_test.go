package gateway_test

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/greendot/greendot/gateway"
	"github.com/greendot/greendot/internal/metricstest"
	"github.com/greendot/greendot/internal/natstest"
	"github.com/greendot/greendot/system/systest"
)

// garbage holds what TestMemoryGivenBackWhenQuiet lets go.
var garbage [][]byte

// TestMemoryGivenBackWhenQuiet: a gateway whose process grew its heap and
// then went quiet collects and gives the free memory back to the system.
func TestMemoryGivenBackWhenQuiet(t *testing.T) {
	sys := systest.Start(t, systest.Options{Gateway: gateway.Config{MemoryTrimInterval: 500 * time.Millisecond}})
	gw := sys.Gateway()
	for range 64 {
		garbage = append(garbage, make([]byte, 1<<20))
	}
	runtime.GC() // live, so that the heap's goal grows past it
	garbage = nil
	natstest.CheckFor(t, 30*time.Second, 100*time.Millisecond, func() error {
		if v, _ := metricstest.Value(gw.Registry(), "greendot_gateway_memory_trims_total"); v < 1 {
			return fmt.Errorf("memory trims = %v, want at least 1", v)
		}
		return nil
	})
	s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(s)
	if released := s[0].Value.Uint64(); released < 32<<20 {
		t.Errorf("%d MiB given back to the system, want at least 32 of the 64 let go", released>>20)
	}
}
