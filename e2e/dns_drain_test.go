package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// lookups resolves kubernetes.default through 10.96.0.10 from a pod, over
// UDP and TCP in turn, each on a new socket as glibc does, one attempt with
// a 2 s timeout (a lost UDP query costs glibc 5 s), until stop is closed.
type lookups struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	failures   []string
}

func (lk *lookups) run(ctx context.Context, wg *sync.WaitGroup, nsPath, proto string, stop <-chan struct{}) {
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case <-time.After(5 * time.Millisecond):
			}
			if err := askVIPIn(nsPath, proto); err != nil {
				lk.failed.Add(1)
				lk.mu.Lock()
				lk.failures = append(lk.failures, fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), proto, err))
				lk.mu.Unlock()
			} else {
				lk.ok.Add(1)
			}
		}
	})
}

// askVIPIn makes the socket inside the pod's namespace (it stays there for
// its life) and asks once, waiting 2 s for the answer.
func askVIPIn(nsPath, proto string) error { return askVIPWithin(nsPath, proto, 2*time.Second) }

// askVIPWithin is askVIPIn waiting timeout for the answer.
func askVIPWithin(nsPath, proto string, timeout time.Duration) error {
	c := &mdns.Client{Net: proto, Timeout: timeout}
	var conn *mdns.Conn
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		conn, err = c.Dial("10.96.0.10:53")
		return err
	})
	if err != nil {
		return err
	}
	defer conn.Close()
	q := new(mdns.Msg)
	q.SetQuestion("kubernetes.default.svc.cluster.local.", mdns.TypeA)
	m, _, err := c.ExchangeWithConn(q, conn)
	if err != nil {
		return err
	}
	if m.Rcode != mdns.RcodeSuccess || len(m.Answer) != 1 {
		return fmt.Errorf("rcode %s, %d answers", mdns.RcodeToString[m.Rcode], len(m.Answer))
	}
	return nil
}

// TestDnsdRolloutLosesNoLookup: a client pod resolves over UDP and TCP
// through 10.96.0.10 while the dnsd behind it is replaced as a rolling
// update does: the replacement starts and turns ready, the old one gets
// SIGTERM, and its endpoint turns terminating only half a second later (the
// endpoint controller and every proxy take a moment). The old dnsd keeps
// answering until no query has come for its quiet interval, then exits 0.
// No lookup fails or times out.
func TestDnsdRolloutLosesNoLookup(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:2]})
	for _, n := range l.Nodes {
		if _, err := n.StartProxyd(ctx); err != nil {
			t.Fatal(err)
		}
	}
	oldPod, err := l.Nodes[0].AddPod(ctx, "dnsold")
	if err != nil {
		t.Fatal(err)
	}
	newPod, err := l.Nodes[1].AddPod(ctx, "dnsnew")
	if err != nil {
		t.Fatal(err)
	}
	client, err := l.Nodes[1].AddPod(ctx, "client")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("dns.yaml", dnsTestState); err != nil {
		t.Fatal(err)
	}
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(oldPod.IP.String()+" true true false")); err != nil {
		t.Fatal(err)
	}
	startDnsd := func(p *lab.Pod) *lab.Proc {
		d, err := p.Start("dnsd", filepath.Join(l.BinDir, "dnsd"), "--state-dir", l.StateDir(),
			"--upstream", l.OutsideIP.String()+":53", "--drain-quiet=2s", "--drain-max=20s")
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	oldDnsd := startDnsd(oldPod)
	deadline := time.Now().Add(60 * time.Second)
	for askVIPIn(client.NSPath(), "udp") != nil || askVIPIn(client.NSPath(), "tcp") != nil {
		if time.Now().After(deadline) {
			t.Fatalf("no answer through 10.96.0.10 after 60s\ndnsd:\n%s\n%s", oldDnsd.Output(), l.Logs())
		}
		time.Sleep(200 * time.Millisecond)
	}

	var udp, tcp lookups
	stop := make(chan struct{})
	var wg sync.WaitGroup
	udp.run(ctx, &wg, client.NSPath(), "udp", stop)
	tcp.run(ctx, &wg, client.NSPath(), "tcp", stop)
	stopClients := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopClients()

	// The replacement comes up and turns ready.
	newDnsd := startDnsd(newPod)
	for {
		code, _ := httpGetIn(newPod.NSPath(), "127.0.0.1:8181", "/ready")
		if code == 200 {
			break
		}
		if time.Now().After(deadline.Add(30 * time.Second)) {
			t.Fatalf("replacement dnsd not ready\n%s", newDnsd.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(oldPod.IP.String()+" true true false", newPod.IP.String()+" true true false")); err != nil {
		t.Fatal(err)
	}
	before := udp.ok.Load() + tcp.ok.Load()

	// SIGTERM to the old one; its endpoint turns terminating a little later.
	termAt := time.Now()
	if err := syscall.Kill(oldDnsd.Pid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	time.Sleep(500 * time.Millisecond) // the lag of the endpoint controller and the proxies, stood for
	if err := l.WriteState("kube-dns-slice.yaml", kubeDNSSlice(oldPod.IP.String()+" false false true", newPod.IP.String()+" true true false")); err != nil {
		t.Fatal(err)
	}
	if code, body := httpGetIn(oldPod.NSPath(), "127.0.0.1:8181", "/ready"); code != 503 {
		t.Errorf("old dnsd /ready while draining: %d %q, want 503", code, body)
	}
	select {
	case <-oldDnsd.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("old dnsd still running 30s after SIGTERM\n%s", oldDnsd.Output())
	}
	exited := time.Since(termAt)
	if err := oldDnsd.Wait(ctx); err != nil {
		t.Errorf("old dnsd exit: %v\n%s", err, oldDnsd.Output())
	}
	if !strings.Contains(oldDnsd.Output(), "drained") {
		t.Errorf("old dnsd did not log that it drained:\n%s", oldDnsd.Output())
	}
	// Go on a while with the replacement alone.
	after := udp.ok.Load() + tcp.ok.Load()
	for udp.ok.Load()+tcp.ok.Load() < after+100 {
		if ctx.Err() != nil {
			t.Fatal("the replacement answered fewer than 100 lookups")
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopClients()
	t.Logf("old dnsd exited %v after SIGTERM; lookups: udp %d ok / %d failed, tcp %d ok / %d failed (%d before SIGTERM)",
		exited.Round(10*time.Millisecond), udp.ok.Load(), udp.failed.Load(), tcp.ok.Load(), tcp.failed.Load(), before)
	if exited < 2*time.Second {
		t.Errorf("old dnsd exited %v after SIGTERM, before its 2s quiet interval could pass", exited)
	}
	for _, lk := range []*lookups{&udp, &tcp} {
		if lk.failed.Load() != 0 {
			t.Errorf("%d lookups failed:\n%s", lk.failed.Load(), strings.Join(lk.failures, "\n"))
		}
	}
}
