package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/runner"
	"github.com/podnet/podnet/dataplane/testport"
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

// TestRunDrainsOnStop: when dnsd's context ends (SIGTERM), /ready fails at
// once, queries are still answered, and Run returns only once none has
// come for the quiet interval.
func TestRunDrainsOnStop(t *testing.T) {
	dnsPort, readyPort := testport.Free(t), testport.Free(t)
	clock := runner.NewFakeClock()
	const quiet = 2 * time.Second
	cfg := Config{
		Listen:       []string{fmt.Sprintf("127.0.0.1:%d", dnsPort)},
		Zone:         dns.ZoneOptions{Domain: "cluster.local", TTL: 5},
		Upstreams:    []string{"127.0.0.1:5353"},
		StateDir:     t.TempDir(),
		ReadyAddress: fmt.Sprintf("127.0.0.1:%d", readyPort),
		Drain:        dns.DrainOptions{Quiet: quiet, Max: time.Minute, Clock: clock},
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, slog.New(slog.DiscardHandler)) }()
	readyURL := fmt.Sprintf("http://127.0.0.1:%d/ready", readyPort)
	status := func() (int, string) {
		r, err := http.Get(readyURL)
		if err != nil {
			return 0, err.Error()
		}
		defer r.Body.Close()
		b, _ := io.ReadAll(r.Body)
		return r.StatusCode, strings.TrimSpace(string(b))
	}
	deadline := time.Now().Add(20 * time.Second)
	for code, _ := status(); code != http.StatusOK; code, _ = status() {
		if time.Now().After(deadline) {
			t.Fatal("dnsd not ready after 20s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	query := func() error {
		q := new(mdns.Msg)
		q.SetQuestion("cluster.local.", mdns.TypeSOA)
		m, _, err := (&mdns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(q, cfg.Listen[0])
		if err == nil && m.Rcode != mdns.RcodeSuccess {
			err = fmt.Errorf("rcode %s", mdns.RcodeToString[m.Rcode])
		}
		return err
	}
	if err := query(); err != nil {
		t.Fatal(err)
	}

	cancel()
	<-clock.Asked() // the drain began
	if code, body := status(); code != http.StatusServiceUnavailable || body != "shutting down" {
		t.Errorf("/ready while draining: %d %q, want 503 \"shutting down\"", code, body)
	}
	for range 4 {
		if err := query(); err != nil {
			t.Fatalf("query while draining: %v", err)
		}
		if clock.Advance(quiet/2) == 0 {
			continue
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned while queries kept coming: %v", err)
		case <-clock.Asked():
		}
	}
	if clock.Advance(quiet) == 0 {
		t.Fatal("no drain timer fired a quiet interval after the last query")
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run still running 10s after a quiet interval without queries")
	}
}
