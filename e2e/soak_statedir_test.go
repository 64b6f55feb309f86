package e2e

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// stateDirServices is how many Service files one run of the scenario
// writes.
const stateDirServices = 30

// TestSoakStateDirRenames is issue 26's scenario with the real daemons:
// proxyd on a lab node and dnsd on loopback read one state directory;
// Service files (a Service and its EndpointSlice each) are written as
// NAME.yaml.tmp and renamed to NAME.yaml at random intervals of 0-100 ms.
// Every Service must be programmed by proxyd (its /status) and answered
// by dnsd within 2 s of its rename; then the files are removed and every
// Service must be gone from both. make test runs it once, make soak 100
// times (the goal: 0 files lost in 100 runs); PODNET_STATEDIR_RUNS sets
// the count.
func TestSoakStateDirRenames(t *testing.T) {
	roottest.Require(t)
	runs := soakSize(1, 100)
	if v := os.Getenv("PODNET_STATEDIR_RUNS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("PODNET_STATEDIR_RUNS=%q: want a positive count", v)
		}
		runs = n
	}
	l := lab.Start(t, lab.Options{Nodes: lab.DefaultNodes()[:1]})
	n := l.Node("node1")
	p, err := n.Start("proxyd", svcProxydArgs(l, n, "iptables")...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Stop() })
	d := startDnsd(t, dnsdBinary(t), l.StateDir(), "--upstream", "127.0.0.1:9")
	d.waitReady(t)
	waitUntil(t, 10*time.Second, func() bool { return svcFileExists(n.NodeConfigPath()) }, "node config of node1")

	var lost int
	var slowest time.Duration
	for run := range runs {
		lostNow, slowNow := stateDirRun(t, l, n, d, run)
		lost += lostNow
		slowest = max(slowest, slowNow)
	}
	t.Logf("%d runs of %d Service files each: %d lost (not applied within 2 s by proxyd or dnsd); slowest file applied by both %v after its rename",
		runs, stateDirServices, lost, slowest)
}

// stateDirRun writes one run's files, waits until both daemons hold every
// Service, removes them and waits until neither does. It returns how many
// files were not applied by both within 2 s of their rename, and the
// slowest time to applied.
func stateDirRun(t *testing.T, l *lab.Lab, n *lab.Node, d *dnsdProc, run int) (lost int, slowest time.Duration) {
	t.Helper()
	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(run)))
	names := make([]string, stateDirServices)
	for i := range names {
		names[i] = fmt.Sprintf("ren-%d-%d", run, i)
	}
	// The files are written while the daemons are watched: each file's
	// time to applied runs from its own rename.
	var mu sync.Mutex
	renamed := make(map[string]time.Time)
	written := make(chan error, 1)
	go func() {
		for i, name := range names {
			path := filepath.Join(l.StateDir(), name+".yaml")
			if err := os.WriteFile(path+".tmp", []byte(stateDirServiceYAML(name, run, i)), 0o644); err != nil {
				written <- err
				return
			}
			if err := os.Rename(path+".tmp", path); err != nil {
				written <- err
				return
			}
			mu.Lock()
			renamed[name] = time.Now()
			mu.Unlock()
			time.Sleep(time.Duration(rnd.IntN(100)) * time.Millisecond)
		}
		written <- nil
	}()
	applied := make(map[string]time.Duration)
	var deadline time.Time // 2 s after the last rename
	for len(applied) < len(names) && (deadline.IsZero() || time.Now().Before(deadline)) {
		select {
		case err := <-written:
			if err != nil {
				t.Fatal(err)
			}
			deadline = time.Now().Add(2 * time.Second)
		default:
		}
		programmed := proxydServices(t, n)
		now := time.Now()
		mu.Lock()
		for _, name := range names {
			at, ok := renamed[name]
			if _, done := applied[name]; done || !ok || !programmed[name] || !dnsdAnswers(t, d, name) {
				continue
			}
			applied[name] = now.Sub(at)
		}
		mu.Unlock()
		time.Sleep(20 * time.Millisecond)
	}
	if deadline.IsZero() {
		if err := <-written; err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range names {
		took, ok := applied[name]
		if !ok || took > 2*time.Second {
			lost++
			t.Errorf("run %d: %s not programmed by proxyd and answered by dnsd within 2 s of its rename (proxyd: %v, dnsd: %v)",
				run, name, proxydServices(t, n)[name], dnsdAnswers(t, d, name))
			continue
		}
		slowest = max(slowest, took)
	}
	for _, name := range names {
		if err := l.RemoveState(name + ".yaml"); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 5*time.Second, func() bool {
		programmed := proxydServices(t, n)
		return !slices.ContainsFunc(names, func(name string) bool { return programmed[name] || dnsdAnswers(t, d, name) })
	}, fmt.Sprintf("run %d's Services gone from proxyd and dnsd", run))
	return lost, slowest
}

func stateDirServiceYAML(name string, run, i int) string {
	ip := fmt.Sprintf("10.%d.%d.%d", 97+run/250, run%250, i+1)
	return fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: %s, namespace: default}
spec: {clusterIP: %s, clusterIPs: [%s], ports: [{name: http, port: 80, protocol: TCP}]}
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: %s-1, namespace: default, labels: {kubernetes.io/service-name: %s}}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: [10.244.1.%d], conditions: {ready: true}}]
`, name, ip, ip, name, name, i+10)
}

// proxydServices are the default namespace's Services proxyd on n has
// programmed, by name, from its /status.
func proxydServices(t *testing.T, n *lab.Node) map[string]bool {
	t.Helper()
	code, body, err := svcHTTPGet(n.NSPath(), "127.0.0.1:10249/status")
	if err != nil || code != 200 {
		t.Fatalf("proxyd /status: %d %v", code, err)
	}
	var st struct {
		ServiceProxy proxy.Status `json:"serviceProxy"`
	}
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("proxyd /status: %v", err)
	}
	out := make(map[string]bool)
	for _, s := range st.ServiceProxy.Services {
		if s.Namespace == "default" && len(s.Ports) > 0 && !s.Ports[0].NoEndpoints {
			out[s.Name] = true
		}
	}
	return out
}

// dnsdAnswers reports whether dnsd answers the Service's name with an
// address.
func dnsdAnswers(t *testing.T, d *dnsdProc, name string) bool {
	t.Helper()
	m, err := d.ask(t, "udp", name+".default.svc.cluster.local.")
	return err == nil && m.Rcode == mdns.RcodeSuccess && len(m.Answer) > 0
}
