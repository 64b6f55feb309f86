package daemon

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/dns"
)

// TestRunFailsOnBusyPortAtStart: a taken HTTP port fails dnsd at once,
// naming the endpoint and address, like proxyd.
func TestRunFailsOnBusyPortAtStart(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := Config{
		Listen:         []string{"127.0.0.1:0"},
		Zone:           dns.ZoneOptions{Domain: "cluster.local"},
		Upstreams:      []string{"127.0.0.1:5353"},
		StateDir:       t.TempDir(),
		MetricsAddress: "127.0.0.1:0",
		ReadyAddress:   ln.Addr().String(),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = Run(ctx, cfg, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "listen ready on "+cfg.ReadyAddress) {
		t.Fatalf("err = %v, want one naming the ready endpoint and its address", err)
	}
	if ctx.Err() != nil {
		t.Error("Run returned only when the context ended")
	}
}
