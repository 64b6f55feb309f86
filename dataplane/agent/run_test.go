package agent

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/nodenet"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/routing"
	"github.com/podnet/podnet/dataplane/runner"
)

const twoNodes = `apiVersion: v1
kind: Node
metadata: {name: node1}
spec: {podCIDR: 10.244.1.0/24}
status:
  addresses: [{type: InternalIP, address: 192.168.10.11}]
---
apiVersion: v1
kind: Node
metadata: {name: node2}
spec: {podCIDR: 10.244.2.0/24}
status:
  addresses: [{type: InternalIP, address: 192.168.10.12}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  clusterIP: 10.96.0.20
  ports: [{port: 80, protocol: TCP}]
`

// recordingBackend counts the Services of each sync and, when kernel is
// set, keeps what the node's routes were at the first one; each sync is
// announced on synced (when set, without blocking).
type recordingBackend struct {
	mu          sync.Mutex
	syncs       []int
	kernel      *routing.FakeKernel
	firstRoutes string
	announce    chan struct{}
}

func (b *recordingBackend) Sync(ports map[cluster.Key][]*proxy.ServicePort, _ map[cluster.Key]bool, _ bool) (proxy.SyncResult, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.syncs) == 0 && b.kernel != nil {
		b.firstRoutes = b.kernel.Dump()
	}
	b.syncs = append(b.syncs, len(ports))
	if b.announce != nil {
		select {
		case b.announce <- struct{}{}:
		default:
		}
	}
	return proxy.SyncResult{}, nil
}

func (b *recordingBackend) synced() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]int(nil), b.syncs...)
}

// fakeKernel is a whole node kernel of fakes: node1 on eth0.
func fakeKernel() (*nodenet.Kernel, *routing.FakeKernel, *hostnet.FakeIPTables) {
	k := routing.NewFakeKernel(map[string]netip.Prefix{"eth0": netip.MustParsePrefix("192.168.10.0/24")})
	ipt := hostnet.NewFakeIPTables()
	return &nodenet.Kernel{
		Routes:   map[ipfamily.Family]routing.Kernel{ipfamily.IPv4: k},
		IPTables: map[ipfamily.Family]hostnet.IPTables{ipfamily.IPv4: ipt},
		Sysctl:   fakeSysctl{"net/ipv4/ip_forward": "0", "net/bridge/bridge-nf-call-iptables": "0"},
		Modprobe: func(string) error { return nil },
		Links: func() ([]link.Interface, error) {
			return []link.Interface{{Name: "lo", MTU: 65536, Addrs: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
				{Name: "eth0", MTU: 1500, Addrs: []netip.Prefix{netip.MustParsePrefix("192.168.10.11/24")}}}, nil
		},
		Watch: func(ctx context.Context, _ func(routing.Event)) error { <-ctx.Done(); return nil },
	}, k, ipt
}

func runOptions(t *testing.T, kernel *nodenet.Kernel) Options {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cluster.yaml"), []byte(twoNodes), 0o644); err != nil {
		t.Fatal(err)
	}
	return Options{
		NodeName: "node1", StateDir: dir, ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
		Backend: routing.BackendHostGW, VXLANVNI: 1, VXLANPort: 8472,
		NodeConfigPath: filepath.Join(t.TempDir(), "node.json"), Masquerade: true,
		SyncPeriod: time.Minute, MinSyncPeriod: 10 * time.Millisecond, Kernel: kernel,
	}
}

// runWithRecordingProxy runs the agent with o and a Service proxy
// recording its syncs into b, until the test ends.
func runWithRecordingProxy(t *testing.T, o Options, b *recordingBackend) *recordingBackend {
	fake := proxy.Mode{Name: "fake", New: func(proxy.Config) (proxy.Backend, error) { return b, nil }}
	o.ServiceProxy = &proxy.ServiceOptions{Mode: fake, Modes: proxy.Modes{fake}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return b
}

// TestRunWiresTheNode runs the whole agent on fakes: from the state
// directory to the node config, the route to node2, podnet's chains, the
// sysctls and a Service proxy that sees the Service.
func TestRunWiresTheNode(t *testing.T) {
	kernel, routes, ipt := fakeKernel()
	o := runOptions(t, kernel)
	o.Health = app.NewHealth()
	b := runWithRecordingProxy(t, o, &recordingBackend{})

	deadline := time.Now().Add(10 * time.Second)
	for {
		cfg, err := nodeconfig.Read(o.NodeConfigPath)
		if err == nil {
			if cfg.PodCIDR != netip.MustParsePrefix("10.244.1.0/24") || cfg.MTU != 1500 {
				t.Errorf("node config %+v", cfg)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no node config: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for len(b.synced()) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s := b.synced(); len(s) == 0 || s[0] != 1 {
		t.Errorf("service proxy syncs %v, want a first one with the Service", s)
	}
	if d := routes.Dump(); !strings.Contains(d, "route 10.244.2.0/24 via 192.168.10.12 dev eth0") {
		t.Errorf("no route to node2:\n%s", d)
	}
	if d := ipt.Dump(); !strings.Contains(d, hostnet.ChainPostrouting) {
		t.Errorf("no podnet chains:\n%s", d)
	}
	if s := kernel.Sysctl.(fakeSysctl); s["net/ipv4/ip_forward"] != "1" {
		t.Errorf("sysctls %v", s)
	}
	// The daemon's health (served by app.Daemon) answers as kube-proxy's
	// on /healthz and /livez, naming the parts' checks.
	for _, path := range []string{"/healthz", "/livez"} {
		rec := httptest.NewRecorder()
		o.Health.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"nodeEligible":true`) {
			t.Errorf("%s: %d %s, want 200 with kube-proxy's body", path, rec.Code, rec.Body)
		}
	}
	states := o.Health.Checker.States()
	for _, c := range []string{componentState, nodenet.Component, proxy.HealthComponent} {
		if _, ok := states[c]; !ok {
			t.Errorf("health has no %s check: %v", c, states)
		}
	}
}

// TestRunFailsOnBusyPortBeforeTouchingTheNode: a taken /metrics port
// fails Run at once, with nothing written to the kernel. (The /healthz
// port is the daemon skeleton's: app's TestDaemonHealthPortTakenFailsFirst.)
func TestRunFailsOnBusyPortBeforeTouchingTheNode(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	kernel, routes, ipt := fakeKernel()
	o := runOptions(t, kernel)
	o.MetricsAddr = ln.Addr().String()
	err = Run(context.Background(), o)
	if err == nil || !strings.Contains(err.Error(), "listen metrics on "+o.MetricsAddr) {
		t.Fatalf("err = %v, want one naming the endpoint and address", err)
	}
	if routes.Mutations != 0 || ipt.Writes != 0 {
		t.Errorf("%d route and %d iptables changes before failing", routes.Mutations, ipt.Writes)
	}
	if _, err := os.Stat(o.NodeConfigPath); !os.IsNotExist(err) {
		t.Errorf("node config written: %v", err)
	}
}

// TestServiceProxyWaitsForTheFirstRoutes: the Service proxy's first sync
// comes after the node network's first one has ended, not beside it. The
// agent runs on a fake clock, so the wait's limit (routesFirstLimit) never
// passes on its own: the proxy syncing while the node network's first sync
// is held means it did not wait.
func TestServiceProxyWaitsForTheFirstRoutes(t *testing.T) {
	kernel, routes, _ := fakeKernel()
	release := make(chan struct{})
	var released sync.Once
	unblock := func() { released.Do(func() { close(release) }) }
	links := kernel.Links
	var once sync.Once
	kernel.Links = func() ([]link.Interface, error) {
		once.Do(func() { <-release })
		return links()
	}
	clock := runner.NewFakeClock()
	o := runOptions(t, kernel)
	o.Clock = clock
	b := runWithRecordingProxy(t, o, &recordingBackend{kernel: routes, announce: make(chan struct{}, 1)})
	t.Cleanup(unblock) // runs first: Run's end waits for the blocked sync

	// The Service proxy is waiting once its limit is armed on the clock.
	limit := clock.Now().Add(routesFirstLimit)
	timeout := time.After(10 * time.Second)
	for !slices.Contains(clock.Pending(), limit) {
		select {
		case <-clock.Asked():
		case <-b.announce:
			t.Fatalf("Service proxy synced %v while the node network's first sync was still running", b.synced())
		case <-timeout:
			t.Fatalf("the Service proxy never waited for the node network (clock timers %v)", clock.Pending())
		}
	}
	if s := b.synced(); len(s) != 0 {
		t.Fatalf("Service proxy synced %v while the node network's first sync was still running", s)
	}
	unblock()
	select {
	case <-b.announce:
	case <-time.After(10 * time.Second):
		t.Fatal("no Service proxy sync 10 s after the node network's first sync was released")
	}
	if s := b.synced(); s[0] != 1 {
		t.Fatalf("service proxy syncs %v, want a first one with the Service", s)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !strings.Contains(b.firstRoutes, "route 10.244.2.0/24 via 192.168.10.12 dev eth0") {
		t.Errorf("the Service proxy synced before the route to node2 was in place:\n%s", b.firstRoutes)
	}
}
