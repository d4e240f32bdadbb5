package ops

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
)

const dashboardPath = "../../deploy/grafana/greendot.json"

// TestDashboard checks that the Grafana dashboard is importable (a valid
// dashboard model with a Prometheus data source variable), that every
// query names metrics greendot registers, and that it covers what the
// operators' view promises.
func TestDashboard(t *testing.T) {
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		UID           string `json:"uid"`
		Title         string `json:"title"`
		SchemaVersion int    `json:"schemaVersion"`
		Templating    struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *struct {
				Type string `json:"type"`
				UID  string `json:"uid"`
			} `json:"datasource"`
			GridPos *struct{ H, W, X, Y int } `json:"gridPos"`
			Targets []struct {
				Expr  string `json:"expr"`
				RefID string `json:"refId"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s is not valid JSON: %v", dashboardPath, err)
	}
	if dash.UID == "" || dash.Title == "" || dash.SchemaVersion < 30 {
		t.Errorf("uid %q, title %q, schemaVersion %d: want all set (schemaVersion >= 30)", dash.UID, dash.Title, dash.SchemaVersion)
	}
	hasDS := false
	for _, v := range dash.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			hasDS = true
		}
	}
	if !hasDS {
		t.Error("no Prometheus data source variable named datasource")
	}

	registered := metricNames(t)
	metricRef := regexp.MustCompile(`\bgreendot_[a-z_]+`)
	used := map[string]bool{}
	ids := map[int]bool{}
	queries := 0
	for _, p := range dash.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.GridPos == nil || p.GridPos.W <= 0 || p.GridPos.W > 24 || p.GridPos.H <= 0 || p.GridPos.X+p.GridPos.W > 24 {
			t.Errorf("panel %q: bad gridPos %+v", p.Title, p.GridPos)
		}
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" || p.Datasource.Type != "prometheus" {
			t.Errorf("panel %q: datasource %+v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		refs := map[string]bool{}
		for _, tg := range p.Targets {
			queries++
			if tg.RefID == "" || refs[tg.RefID] {
				t.Errorf("panel %q: refId %q missing or repeated", p.Title, tg.RefID)
			}
			refs[tg.RefID] = true
			if err := checkPromQL(tg.Expr); err != nil {
				t.Errorf("panel %q: %s: %v", p.Title, tg.Expr, err)
			}
			for _, m := range metricRef.FindAllString(tg.Expr, -1) {
				base := m
				for _, suffix := range []string{"_bucket", "_count", "_sum"} {
					if b, ok := strings.CutSuffix(m, suffix); ok && registered[b] {
						base = b
					}
				}
				if !registered[base] {
					t.Errorf("panel %q queries %s, which no greendot process registers", p.Title, m)
				}
				used[base] = true
			}
		}
	}
	// What the operators' view promises the dashboard shows.
	for _, m := range []string{
		"greendot_gateway_connections", "greendot_gateway_upgrades_total",
		"greendot_gateway_messages_received_total", "greendot_gateway_messages_sent_total",
		"greendot_gateway_kv_writes_total", "greendot_gateway_kv_seconds", "greendot_gateway_propagation_seconds",
		"greendot_reaper_transitions_total", "greendot_fanout_events_published_total", "greendot_fanout_revisions_total",
	} {
		if !used[m] {
			t.Errorf("the dashboard does not show %s", m)
		}
	}
	if queries < 20 {
		t.Errorf("%d queries: the dashboard lost its panels?", queries)
	}
}

// checkPromQL catches the mistakes a hand-edited query makes: unbalanced
// brackets, a rate without a range, a quantile over something that is not
// a histogram's buckets.
func checkPromQL(expr string) error {
	var stack []rune
	pairs := map[rune]rune{')': '(', ']': '[', '}': '{'}
	for _, r := range expr {
		switch r {
		case '(', '[', '{':
			stack = append(stack, r)
		case ')', ']', '}':
			if len(stack) == 0 || stack[len(stack)-1] != pairs[r] {
				return errUnbalanced
			}
			stack = stack[:len(stack)-1]
		}
	}
	if len(stack) != 0 {
		return errUnbalanced
	}
	for _, fn := range []string{"rate(", "increase("} {
		for rest := expr; ; {
			i := strings.Index(rest, fn)
			if i < 0 {
				break
			}
			rest = rest[i+len(fn):]
			end := strings.Index(rest, ")")
			if end < 0 || !strings.Contains(rest[:end], "[") {
				return errNoRange
			}
		}
	}
	if strings.Contains(expr, "histogram_quantile(") && !strings.Contains(expr, "_bucket") {
		return errNotBuckets
	}
	return nil
}

type promQLError string

func (e promQLError) Error() string { return string(e) }

const (
	errUnbalanced = promQLError("unbalanced brackets")
	errNoRange    = promQLError("rate or increase without a range selector")
	errNotBuckets = promQLError("histogram_quantile over something other than _bucket series")
)
