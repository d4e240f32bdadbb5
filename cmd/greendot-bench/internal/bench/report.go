package bench

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Report is the outcome of a bench: the machine, the configuration, every
// run's figures, and their summary over the runs.
type Report struct {
	Scenario string `json:"scenario"`
	// Args is the command line, when the caller sets it.
	Args    []string      `json:"args,omitempty"`
	Machine Machine       `json:"machine"`
	Config  Config        `json:"config"`
	Runs    []RunResult   `json:"runs"`
	Summary []Summary     `json:"summary"`
	Elapsed time.Duration `json:"elapsed_ns"`
}

// Machine describes the machine a bench ran on.
type Machine struct {
	CPU      string `json:"cpu"`
	Cores    int    `json:"cores"`
	MemoryGB string `json:"memory_gib"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go"`
}

// RunResult is one run of a scenario, on a fresh system.
type RunResult struct {
	Started time.Time `json:"started"`
	Seconds float64   `json:"seconds"`
	// LoadBefore and LoadAfter are the 1, 5 and 15 minute load averages
	// when the run started and ended.
	LoadBefore [3]float64      `json:"load_before"`
	LoadAfter  [3]float64      `json:"load_after"`
	Figures    []Figure        `json:"figures"`
	Gateways   []GatewayFigure `json:"gateways,omitempty"`
	// Errors holds examples of errors workers counted.
	Errors []string `json:"errors,omitempty"`
}

// Figure is one measured value.
type Figure struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Target is the goal for this figure, if there is one ("<= 50").
	Target string `json:"target,omitempty"`
}

// GatewayFigure is what one gateway process measured in an idle run.
type GatewayFigure struct {
	Gateway      int     `json:"gateway"`
	Conns        float64 `json:"conns"`
	RSSBaseline  int64   `json:"rss_baseline_bytes"`
	RSSAfter     int64   `json:"rss_after_bytes"`
	HeapBaseline int64   `json:"heap_inuse_baseline_bytes"`
	HeapAfter    int64   `json:"heap_inuse_after_bytes"`
	CPUPercent   float64 `json:"cpu_percent"`
	WritesPerSec float64 `json:"kv_writes_per_second"`
}

// Summary is a figure over every run: its median and spread.
type Summary struct {
	Name   string  `json:"name"`
	Unit   string  `json:"unit"`
	Target string  `json:"target,omitempty"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
	Runs   int     `json:"runs"`
}

// Figure returns the summary of the named figure.
func (r *Report) Figure(name string) (Summary, bool) {
	for _, s := range r.Summary {
		if s.Name == name {
			return s, true
		}
	}
	return Summary{}, false
}

// summarize computes Summary from Runs, keeping the figures' order.
func (r *Report) summarize() {
	r.Summary = nil
	var order []string
	vals := map[string][]float64{}
	meta := map[string]Figure{}
	for _, run := range r.Runs {
		for _, f := range run.Figures {
			if _, ok := meta[f.Name]; !ok {
				order = append(order, f.Name)
				meta[f.Name] = f
			}
			vals[f.Name] = append(vals[f.Name], f.Value)
		}
	}
	for _, name := range order {
		v := vals[name]
		slices.Sort(v)
		med := v[len(v)/2]
		if len(v)%2 == 0 {
			med = (v[len(v)/2-1] + v[len(v)/2]) / 2
		}
		r.Summary = append(r.Summary, Summary{
			Name: name, Unit: meta[name].Unit, Target: meta[name].Target,
			Median: med, Min: v[0], Max: v[len(v)-1], Runs: len(v),
		})
	}
}

// WriteMarkdown writes the report as a markdown section with one table.
func (r *Report) WriteMarkdown(w io.Writer) error {
	bw := bufio.NewWriter(w)
	c := r.Config
	fmt.Fprintf(bw, "## greendot-bench: %s, %d connections\n\n", r.Scenario, c.Conns)
	m := r.Machine
	fmt.Fprintf(bw, "Machine: %s, %d cores, %s GiB, Linux %s, %s.\n", m.CPU, m.Cores, m.MemoryGB, m.Kernel, m.Go)
	fmt.Fprintf(bw, "Layout: %d targets, %d watchers following %d each, %d idle; %d gateways, %d workers, %d source addresses.\n",
		c.Targets, c.Watchers, c.Follows, c.Conns-c.Targets-c.Watchers, c.Gateways, c.Workers, c.Sources)
	if len(c.GatewayArgs)+len(c.GatewayEnv) > 0 {
		fmt.Fprintf(bw, "Gateways started with: %s.\n", strings.Join(append(slices.Clone(c.GatewayEnv), c.GatewayArgs...), " "))
	}
	if c.WSCompression {
		fmt.Fprintf(bw, "Connections offer permessage-deflate (--ws-compression).\n")
	}
	var loads []string
	for _, run := range r.Runs {
		loads = append(loads, fmt.Sprintf("%.2f→%.2f", run.LoadBefore[0], run.LoadAfter[0]))
	}
	fmt.Fprintf(bw, "Runs: %d (1-minute load average before→after each: %s).\n\n", len(r.Runs), strings.Join(loads, ", "))
	fmt.Fprintf(bw, "| figure | median | min | max | unit | target |\n| --- | ---: | ---: | ---: | --- | --- |\n")
	for _, s := range r.Summary {
		fmt.Fprintf(bw, "| %s | %s | %s | %s | %s | %s |\n", s.Name, num(s.Median), num(s.Min), num(s.Max), s.Unit, s.Target)
	}
	for i, run := range r.Runs {
		for _, e := range run.Errors {
			fmt.Fprintf(bw, "\nRun %d error example: %s", i+1, e)
		}
	}
	if slices.ContainsFunc(r.Runs, func(run RunResult) bool { return len(run.Errors) > 0 }) {
		fmt.Fprintln(bw)
	}
	return bw.Flush()
}

// num formats a figure with a precision that suits its size.
func num(v float64) string {
	switch a := math.Abs(v); {
	case v == math.Trunc(v) && a < 1e12:
		return strconv.FormatInt(int64(v), 10)
	case a >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	default:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
}

// readMachine describes this machine from /proc.
func readMachine() Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for l := range strings.Lines(string(b)) {
			if v, ok := strings.CutPrefix(l, "MemTotal:"); ok {
				f := strings.Fields(v)
				if kb, err := strconv.ParseFloat(f[0], 64); err == nil && len(f) == 2 {
					m.MemoryGB = strconv.FormatFloat(kb/(1<<20), 'f', 1, 64)
				}
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// loadAverage reads /proc/loadavg.
func loadAverage() [3]float64 {
	var out [3]float64
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return out
	}
	f := strings.Fields(string(b))
	for i := 0; i < 3 && i < len(f); i++ {
		out[i], _ = strconv.ParseFloat(f[i], 64)
	}
	return out
}

// slabBytes is the kernel's slab memory (/proc/meminfo Slab), where the
// socket structures of every connection live; 0 when unread.
func slabBytes() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "Slab:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}
