package e2e

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/roottest"
)

// startDnsmasq runs dnsmasq on a loopback port answering every name under
// domain (several: "a/b") with addr.
func startDnsmasq(t *testing.T, domain, addr string) int {
	t.Helper()
	port := dnsLoopbackPort(t)
	dm := exec.Command(roottest.Tool(t, "dnsmasq", "dnsmasq-base"), "--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces", "--listen-address=127.0.0.1",
		fmt.Sprintf("--port=%d", port), "--address=/"+domain+"/"+addr, "--user="+dnsUserName(), "--pid-file=")
	dm.Stderr = io.Discard
	if err := dm.Start(); err != nil {
		t.Fatalf("start dnsmasq: %v", err)
	}
	t.Cleanup(func() { dm.Process.Kill(); dm.Wait() })
	return port
}

// dnsStateDir writes dnsTestState into dir/state and returns that directory.
func dnsStateDir(t *testing.T, dir string) string {
	t.Helper()
	state := filepath.Join(dir, "state")
	if err := os.MkdirAll(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(state, "cluster.yaml"), []byte(dnsTestState), 0o644); err != nil {
		t.Fatal(err)
	}
	return state
}

// TestDnsdConfigFile: dnsd takes upstreams, stub domains and host records
// from its config file, and applies a changed file while it answers, with
// no query lost.
func TestDnsdConfigFile(t *testing.T) {
	bin := dnsdBinary(t)
	dir := t.TempDir()
	state := dnsStateDir(t, dir)
	flagUp := startDnsmasq(t, "example.test", "192.0.2.1")              // --upstream
	fileUp := startDnsmasq(t, "example.test/corp.example", "192.0.2.2") // upstreamNameservers
	stubUp := startDnsmasq(t, "corp.example", "10.1.0.1")               // stubDomains
	writeConfig := func(s string) {
		t.Helper()
		// As a ConfigMap volume does: a new file renamed over the old.
		tmp := filepath.Join(dir, "config.yaml.tmp")
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, "config.yaml")); err != nil {
			t.Fatal(err)
		}
	}
	writeConfig(fmt.Sprintf("stubDomains:\n  corp.example: [\"127.0.0.1:%d\"]\nhosts:\n  registry.internal: [\"192.0.2.10\"]\n", stubUp))

	dnsPort := dnsLoopbackPort(t)
	cmd := exec.Command(bin, "--state-dir", state, "--config", filepath.Join(dir, "config.yaml"),
		"--listen", fmt.Sprintf("127.0.0.1:%d", dnsPort), "--upstream", fmt.Sprintf("127.0.0.1:%d", flagUp),
		"--metrics-address", "", "--health-address", "", "--ready-address", "", "--no-cache")
	var out strings.Builder
	var outMu sync.Mutex
	cmd.Stdout = writerFunc(func(p []byte) (int, error) { outMu.Lock(); defer outMu.Unlock(); return out.Write(p) })
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	logs := func() string { outMu.Lock(); defer outMu.Unlock(); return out.String() }

	server := fmt.Sprintf("127.0.0.1:%d", dnsPort)
	lookup := func(name string) (string, error) {
		c := &mdns.Client{Net: "udp", Timeout: 2 * time.Second}
		q := new(mdns.Msg)
		q.SetQuestion(name, mdns.TypeA)
		m, _, err := c.Exchange(q, server)
		if err != nil {
			return "", err
		}
		if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
			return "", fmt.Errorf("%s: %s with %d answers", name, mdns.RcodeToString[m.Rcode], len(m.Answer))
		}
		return m.Answer[0].(*mdns.A).A.String(), nil
	}
	expect := func(within time.Duration, want map[string]string) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			bad := ""
			for name, addr := range want {
				if got, err := lookup(name); err != nil || got != addr {
					bad = fmt.Sprintf("%s: %s %v, want %s", name, got, err, addr)
				}
			}
			if bad == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s\n%s", bad, logs())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	expect(10*time.Second, map[string]string{
		"www.example.test.":  "192.0.2.1", // --upstream
		"www.corp.example.":  "10.1.0.1",
		"registry.internal.": "192.0.2.10",
	})

	// Change the file while a client keeps asking: every query answered.
	stop := make(chan struct{})
	var failures []string
	var asked int
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
			asked++
			if _, err := lookup(fmt.Sprintf("n%d.example.test.", i)); err != nil {
				failures = append(failures, err.Error())
			}
		}
	})
	writeConfig(fmt.Sprintf("upstreamNameservers: [\"127.0.0.1:%d\"]\nhosts:\n  registry.internal: [\"192.0.2.11\"]\n", fileUp))
	expect(5*time.Second, map[string]string{
		"www.example.test.":  "192.0.2.2", // upstreamNameservers override --upstream
		"www.corp.example.":  "192.0.2.2", // no stub any more: the default upstream
		"registry.internal.": "192.0.2.11",
	})
	// A broken file is refused; the running configuration stays.
	writeConfig("upstreamNameservers: [\"not an address\"]\n")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(logs(), "config file rejected") {
		if time.Now().After(deadline) {
			t.Fatalf("broken config file not reported:\n%s", logs())
		}
		time.Sleep(50 * time.Millisecond)
	}
	expect(time.Second, map[string]string{"registry.internal.": "192.0.2.11", "www.example.test.": "192.0.2.2"})
	close(stop)
	wg.Wait()
	if len(failures) > 0 || asked < 20 {
		t.Errorf("%d of %d queries failed across the reloads: %v", len(failures), asked, failures)
	} else {
		t.Logf("%d queries across two reloads, none failed", asked)
	}
	if !strings.Contains(logs(), "upstreamNameservers") || !strings.Contains(logs(), "not an address") {
		t.Errorf("the refusal does not name the field and value:\n%s", logs())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
