package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestGroupFirstFailureEndsAll(t *testing.T) {
	g := NewGroup(context.Background())
	boom := errors.New("boom")
	stopped := make(chan struct{})
	g.Go("waiter", func(ctx context.Context) error { <-ctx.Done(); close(stopped); return errors.New("late") })
	g.Go("failer", func(context.Context) error { return boom })
	err := g.Wait()
	if !errors.Is(err, boom) || !strings.HasPrefix(err.Error(), "failer: ") {
		t.Errorf("Wait = %v, want the failer's error, named", err)
	}
	select {
	case <-stopped:
	default:
		t.Error("the other goroutine was not stopped")
	}
}

func TestGroupEndsWithContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	g := NewGroup(ctx)
	g.Go("waiter", func(ctx context.Context) error { <-ctx.Done(); return ctx.Err() })
	cancel()
	if err := g.Wait(); err != nil {
		t.Errorf("Wait = %v, want nil after the context ended", err)
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestServeSharesAnAddress: two endpoints on one address share a
// listener; a busy address fails Serve, naming the endpoint.
func TestServeSharesAnAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	g := NewGroup(context.Background())
	text := func(s string) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, s) })
	}
	if err := Serve(g, nil, Endpoint{Name: "a", Addr: addr, Path: "/a", Handler: text("A")},
		Endpoint{Name: "b", Addr: addr, Path: "/b", Handler: text("B")},
		Endpoint{Name: "off", Path: "/off", Handler: text("off")}); err != nil {
		t.Fatal(err)
	}
	if a, b := get(t, "http://"+addr+"/a"), get(t, "http://"+addr+"/b"); a != "A" || b != "B" {
		t.Errorf("got %q and %q", a, b)
	}
	g2 := NewGroup(context.Background())
	err = Serve(g2, nil, Endpoint{Name: "busy", Addr: addr, Flag: "--busy-address", Path: "/", Handler: text("")})
	_, port, _ := net.SplitHostPort(addr)
	if err == nil || !strings.Contains(err.Error(), "listen busy on "+addr+" (port "+port+"; --busy-address moves it): the port is taken") {
		t.Errorf("Serve on a taken address: %v; want the address, port and flag named", err)
	}
	g.Cancel()
	done := make(chan error)
	go func() { done <- g.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Wait = %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("servers did not stop")
	}
}
