package app

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cli"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func getCode(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestDaemonServesHealth: the skeleton serves the daemon's health on its
// paths from before Main runs until Main returns, answering the checks the
// daemon's parts contribute (200 OK, or 503 naming each failing one), or a
// handler the daemon put on a path.
func TestDaemonServesHealth(t *testing.T) {
	addr := freeAddr(t)
	url := "http://" + addr
	var bad error
	checked := make(chan struct{})
	r := Run{
		Health: HealthEndpoint{Addr: addr, Flag: "--health-address", Paths: []string{"/health", "/livez"}},
		Main: func(ctx context.Context, h *Health) error {
			if code, body := getCode(t, url+"/health"); code != http.StatusOK || body != "OK\n" {
				t.Errorf("/health before any check: %d %q, want 200 OK", code, body)
			}
			h.Checker.Check("dns-server", func() error { return bad })
			h.Checker.Set("cluster-state", nil)
			bad = errors.New("udp 127.0.0.1:53: its loop ended")
			if code, body := getCode(t, url+"/health"); code != http.StatusServiceUnavailable || body != "dns-server: udp 127.0.0.1:53: its loop ended\n" {
				t.Errorf("/health with a failing check: %d %q, want 503 naming it", code, body)
			}
			bad = nil
			if code, body := getCode(t, url+"/health"); code != http.StatusOK || body != "OK\n" {
				t.Errorf("/health with the check good again: %d %q", code, body)
			}
			h.Handle("/livez", http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "own") }))
			if code, body := getCode(t, url+"/livez"); code != http.StatusOK || body != "own" {
				t.Errorf("/livez with a handler of the daemon's: %d %q", code, body)
			}
			if code, _ := getCode(t, url+"/other"); code != http.StatusNotFound {
				t.Errorf("a path not declared: %d, want 404", code)
			}
			close(checked)
			return nil
		},
	}
	if err := r.run(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	<-checked
	if _, err := http.Get(url + "/health"); err == nil {
		t.Error("health still served after Main returned")
	}
}

// TestDaemonHealthPortTakenFailsFirst: a taken health port fails the
// daemon (exit 1, naming the endpoint and its flag) before its Main runs.
func TestDaemonHealthPortTakenFailsFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	ran := false
	d := Daemon{
		Name:  "testd",
		Flags: func(*pflag.FlagSet) {},
		Setup: func(*slog.Logger) (Run, error) {
			return Run{
				Health: HealthEndpoint{Addr: ln.Addr().String(), Flag: "--health-address", Paths: []string{"/health"}},
				Main:   func(context.Context, *Health) error { ran = true; return nil },
			}, nil
		},
	}
	var stdout, stderr bytes.Buffer
	if code := d.Main(nil, &stdout, &stderr); code != cli.ExitError {
		t.Errorf("exit %d, want %d", code, cli.ExitError)
	}
	if ran {
		t.Error("Main ran with its health port taken")
	}
	if !strings.Contains(stderr.String(), "listen health on "+ln.Addr().String()) || !strings.Contains(stderr.String(), "--health-address moves it") {
		t.Errorf("log %q does not name the endpoint, address and flag", stderr.String())
	}
}
