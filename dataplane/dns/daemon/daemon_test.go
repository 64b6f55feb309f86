package daemon

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/app"
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
		Health:       app.NewHealth(),
	}
	health := func() (int, string) {
		rec := httptest.NewRecorder()
		cfg.Health.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/health", nil))
		return rec.Code, strings.TrimSpace(rec.Body.String())
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
	if code, body := health(); code != http.StatusOK || body != "OK" {
		t.Errorf("/health while serving: %d %q, want 200 OK", code, body)
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
	// /health tells the DNS server's real state: stopped.
	if code, body := health(); code != http.StatusServiceUnavailable || body != HealthComponent+": stopped" {
		t.Errorf("/health once the server stopped: %d %q, want 503 naming it", code, body)
	}
}

// logRecords is a slog handler that hands every record's message to a
// channel (without blocking), so a test waits for what the daemon logs.
type logRecords chan string

func (l logRecords) Enabled(context.Context, slog.Level) bool { return true }
func (l logRecords) Handle(_ context.Context, r slog.Record) error {
	select {
	case l <- r.Message:
	default:
	}
	return nil
}
func (l logRecords) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l logRecords) WithGroup(string) slog.Handler      { return l }

// TestConfigFileReadOnTheClock: the config file is read every configPoll
// of dnsd's clock, not of the wall's: a file written while the clock
// stands is not applied, and is once the clock has moved a configPoll on.
func TestConfigFileReadOnTheClock(t *testing.T) {
	dnsPort := testport.Free(t)
	clock := runner.NewFakeClock()
	logs := make(logRecords, 1024)
	cfg := Config{
		Listen:     []string{fmt.Sprintf("127.0.0.1:%d", dnsPort)},
		Zone:       dns.ZoneOptions{Domain: "cluster.local", TTL: 5},
		Upstreams:  []string{fmt.Sprintf("127.0.0.1:%d", testport.Free(t))}, // nothing there
		StateDir:   t.TempDir(),
		ConfigFile: filepath.Join(t.TempDir(), "dnsd.yaml"),
		Forward:    dns.ForwardOptions{TryTimeout: 200 * time.Millisecond, Deadline: 500 * time.Millisecond},
		Clock:      clock,
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, cfg, slog.New(logs)) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	ask := func() (*mdns.Msg, error) {
		q := new(mdns.Msg)
		q.SetQuestion("registry.internal.", mdns.TypeA)
		m, _, err := (&mdns.Client{Net: "udp", Timeout: 3 * time.Second}).Exchange(q, cfg.Listen[0])
		return m, err
	}
	answered := func(m *mdns.Msg) bool {
		return m != nil && len(m.Answer) == 1 && strings.Contains(m.Answer[0].String(), "192.0.2.10")
	}
	// Serving once a query gets any answer.
	deadline := time.Now().Add(20 * time.Second)
	for _, err := ask(); err != nil; _, err = ask() {
		if time.Now().After(deadline) {
			t.Fatalf("dnsd not answering after 20 s: %v", err)
		}
	}
	if err := os.WriteFile(cfg.ConfigFile, []byte("hosts:\n  registry.internal: [\"192.0.2.10\"]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if m, _ := ask(); answered(m) {
		t.Fatal("the config file was applied while the clock stood still")
	}
	timeout := time.After(10 * time.Second)
	for len(clock.Pending()) == 0 {
		select {
		case <-clock.Asked():
		case <-timeout:
			t.Fatal("no read of the config file armed on dnsd's clock")
		}
	}
	clock.Advance(configPoll)
	for applied := false; !applied; {
		select {
		case msg := <-logs:
			applied = msg == "config file applied"
		case <-timeout:
			t.Fatal("config file not applied a configPoll after it was written")
		}
	}
	if m, err := ask(); !answered(m) {
		t.Fatalf("after a configPoll, registry.internal: %v %v; want the file's 192.0.2.10", m, err)
	}
}
