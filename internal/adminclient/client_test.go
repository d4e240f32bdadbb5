package adminclient

import (
	"testing"

	"github.com/greendot/greendot/pkg/admin"
)

// TestControlSubjects: the discovery subjects are those `nats micro ping`,
// `info` and `stats` ask every instance of a service on.
func TestControlSubjects(t *testing.T) {
	for _, tt := range []struct{ got, want string }{
		{PingSubject(admin.GatewayService), "$SRV.PING." + admin.GatewayService},
		{InfoSubject(admin.ReaperService), "$SRV.INFO." + admin.ReaperService},
		{StatsSubject(admin.FanoutService), "$SRV.STATS." + admin.FanoutService},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
}
