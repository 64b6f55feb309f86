package lab

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/roottest"
)

func TestPlanDefaults(t *testing.T) {
	l, err := newLab(Options{Prefix: "pntest", WorkDir: t.TempDir(), BinDir: "/bin-dir"}, "/cg")
	if err != nil {
		t.Fatal(err)
	}
	type node struct{ name, ns, ip, subnet, gw, podCIDR, zone, cgroup string }
	var got []node
	for _, n := range l.Nodes {
		got = append(got, node{n.Name, n.NS, n.IP.String(), n.Subnet.String(), n.Gateway.String(), n.PodCIDR.String(), n.Zone, n.Cgroup})
	}
	want := []node{
		{"node1", "pntest-node1", "192.168.10.11", "192.168.10.0/24", "192.168.10.1", "10.244.1.0/24", "zone-a", "/cg/podnet-pntest-node1"},
		{"node2", "pntest-node2", "192.168.10.12", "192.168.10.0/24", "192.168.10.1", "10.244.2.0/24", "zone-a", "/cg/podnet-pntest-node2"},
		{"node3", "pntest-node3", "192.168.10.13", "192.168.10.0/24", "192.168.10.1", "10.244.3.0/24", "zone-a", "/cg/podnet-pntest-node3"},
		{"node4", "pntest-node4", "192.168.20.11", "192.168.20.0/24", "192.168.20.1", "10.244.4.0/24", "zone-b", "/cg/podnet-pntest-node4"},
	}
	if len(got) != len(want) {
		t.Fatalf("nodes = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("node %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if len(l.Segments) != 2 || l.Segments[0].Bridge != "br0" || l.Segments[1].Bridge != "br1" {
		t.Errorf("segments = %+v, want br0 for 192.168.10.0/24 and br1 for 192.168.20.0/24", l.Segments)
	}
	if l.Underlay != "pntest-underlay" || l.Router != "pntest-router" || l.Outside != "pntest-outside" {
		t.Errorf("infrastructure namespaces = %s %s %s", l.Underlay, l.Router, l.Outside)
	}
	if l.Nodes[0].Dir != filepath.Join(l.WorkDir, "nodes", "node1") || l.Nodes[0].NodeConfigPath() != filepath.Join(l.WorkDir, "nodes", "node1", "node.json") {
		t.Errorf("node1 dir = %s, config %s", l.Nodes[0].Dir, l.Nodes[0].NodeConfigPath())
	}
	if l.ownsWorkDir {
		t.Errorf("a work dir passed in is the caller's, yet the lab would remove it")
	}
	// A node's own zone overrides its segment's.
	nodes := DefaultNodes()
	nodes[1].Zone = "zone-c"
	l, err = newLab(Options{Prefix: "pntest", WorkDir: t.TempDir(), BinDir: "/bin-dir", Nodes: nodes}, "/cg")
	if err != nil {
		t.Fatal(err)
	}
	if z := []string{l.Nodes[0].Zone, l.Nodes[1].Zone, l.Nodes[3].Zone}; z[0] != "zone-a" || z[1] != "zone-c" || z[2] != "zone-b" {
		t.Errorf("zones %v, want zone-a (its segment's), zone-c (its own), zone-b", z)
	}
}

func TestPlanRandomPrefixAndTempDir(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	a, err := newLab(Options{}, "/cg")
	if err != nil {
		t.Fatal(err)
	}
	b, err := newLab(Options{}, "/cg")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Lab{a, b} {
		if !familyRun.MatchString(l.Prefix) {
			t.Errorf("default prefix %q is not of the family %s", l.Prefix, familyRun)
		}
		if !l.ownsWorkDir || !strings.HasPrefix(filepath.Base(l.WorkDir), "podnet-lab-"+l.Prefix+"-") {
			t.Errorf("default work dir %s (owned %v)", l.WorkDir, l.ownsWorkDir)
		}
	}
	if a.Prefix == b.Prefix {
		t.Errorf("two runs got the same prefix %s (1 in 65536: rerun)", a.Prefix)
	}
}

func TestPlanRejects(t *testing.T) {
	p := netip.MustParsePrefix
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"bad prefix", Options{Prefix: "PN-1"}, "prefix"},
		{"long prefix", Options{Prefix: "pn0123456789abcdef"}, "prefix"},
		{"duplicate node", Options{Nodes: []NodeSpec{{Name: "a", IP: p("192.168.10.11/24")}, {Name: "a", IP: p("192.168.10.12/24")}}}, "duplicate"},
		{"reserved node", Options{Nodes: []NodeSpec{{Name: "router", IP: p("192.168.10.11/24")}}}, "reserved"},
		{"node with dash", Options{Nodes: []NodeSpec{{Name: "node-1", IP: p("192.168.10.11/24")}}}, "node name"},
		{"no ip", Options{Nodes: []NodeSpec{{Name: "a"}}}, "ip"},
		{"ipv6", Options{Nodes: []NodeSpec{{Name: "a", IP: p("fd00::2/64")}}}, "IPv4"},
		{"router address", Options{Nodes: []NodeSpec{{Name: "a", IP: p("192.168.10.1/24")}}}, "router"},
		{"outside overlap", Options{Nodes: []NodeSpec{{Name: "a", IP: p("203.0.113.5/24")}}}, "outside"},
		{"overlapping segments", Options{Nodes: []NodeSpec{{Name: "a", IP: p("192.168.10.11/24")}, {Name: "b", IP: p("192.168.10.200/25")}}}, "overlap"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "work")
			tc.o.WorkDir = dir
			_, err := newLab(tc.o, "/cg")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one mentioning %q", err, tc.want)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("rejected options left the work dir behind")
			}
		})
	}
}

func TestNetworkConfList(t *testing.T) {
	l, err := newLab(Options{Prefix: "pntest", WorkDir: "/w"}, "/cg")
	if err != nil {
		t.Fatal(err)
	}
	got := string(l.Nodes[1].NetworkConfList())
	want := `{"cniVersion":"1.1.0","name":"podnet","plugins":[{"dataDir":"/w/nodes/node2/ipam","logFile":"/w/nodes/node2/cni.log","nodeConfig":"/w/nodes/node2/node.json","type":"podnet"},{"capabilities":{"portMappings":true},"type":"portmap"}]}`
	if got != want {
		t.Errorf("conflist =\n%s\nwant\n%s", got, want)
	}
}

func TestQuotesEcho(t *testing.T) {
	// IPv4 header (IHL 5, protocol 1) + ICMP echo request header with id 0x1234.
	pkt := make([]byte, 28)
	pkt[0], pkt[9] = 0x45, 1
	pkt[20] = 8
	pkt[24], pkt[25] = 0x12, 0x34
	if !quotesEcho(pkt, 0x1234) {
		t.Errorf("echo request with id 0x1234 not recognised")
	}
	if quotesEcho(pkt, 0x1235) {
		t.Errorf("id 0x1235 matched a quote of 0x1234")
	}
	pkt[9] = 17 // UDP
	if quotesEcho(pkt, 0x1234) {
		t.Errorf("a quoted UDP packet matched")
	}
	if quotesEcho(pkt[:10], 0x1234) {
		t.Errorf("a truncated quote matched")
	}
}

func TestPidStart(t *testing.T) {
	me, err := pidStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	r := runRecord{PID: os.Getpid(), PIDStart: me}
	if !r.alive() {
		t.Errorf("this process is not alive by its own record")
	}
	r.PIDStart++
	if r.alive() {
		t.Errorf("a record with another start time (a recycled pid) counts as alive")
	}
	if (runRecord{PID: 0}).alive() {
		t.Errorf("pid 0 counts as alive")
	}
}

// TestSweepCgroupV1: the kubelet cgroup roots a crashed real-node run left
// in the v1 hierarchies (with a child, as the kubelet makes them) are
// removed by the sweep, those of other runs are not. The hierarchy is the
// test's own: a named one without controllers, mounted in a private mount
// namespace of a child process (the test binary again), so the test runs
// on hosts with cgroup v2 alone and the host's mounts never hold it.
func TestSweepCgroupV1(t *testing.T) {
	roottest.Require(t)
	if os.Getenv(sweepV1ChildEnv) == "" {
		runInMountNamespace(t, "^TestSweepCgroupV1$")
		return
	}
	root := t.TempDir()
	if err := unix.Mount("cgroup", root, "cgroup", 0, fmt.Sprintf("none,name=podnet-test-%d", os.Getpid())); err != nil {
		roottest.Unavailable(t, "mount a cgroup v1 hierarchy: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(root, 0); err != nil {
			t.Errorf("unmount the test's cgroup v1 hierarchy: %v", err)
		}
	})
	if roots := CgroupV1Roots(); !slices.Contains(roots, root) {
		t.Fatalf("CgroupV1Roots() = %v, without %s mounted as one", roots, root)
	}
	stale := FamilyPrefix + fmt.Sprintf("%04x", os.Getpid()&0xffff)
	d := filepath.Join(root, "podnet-"+stale+"-node1")
	o := filepath.Join(root, "podnet-zz"+stale+"-node1")
	if err := os.MkdirAll(filepath.Join(d, "kubepods"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(o, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, dir := range []string{d, o} {
			if err := RemoveCgroupTree(dir); err != nil {
				t.Error(err)
			}
		}
	})
	if err := sweepStale(t.Logf); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(d); err == nil {
		t.Errorf("%s survived the sweep", d)
	}
	if _, err := os.Stat(o); err != nil {
		t.Errorf("%s of another family was removed: %v", o, err)
	}
}

// sweepV1ChildEnv tells the test binary it is the child of
// runInMountNamespace.
const sweepV1ChildEnv = "PODNET_LAB_TEST_MOUNTNS_CHILD"

// runInMountNamespace runs the tests matching run in a child process of
// this test binary, in a mount namespace of its own whose mounts are
// private (exec makes them so with CLONE_NEWNS), and fails t when they
// fail. Whatever the child mounts is gone when it exits.
func runInMountNamespace(t *testing.T, run string) {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run", run, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), sweepV1ChildEnv+"=1")
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
	out, err := cmd.CombinedOutput()
	t.Logf("in a private mount namespace:\n%s", out)
	if err != nil {
		t.Fatalf("%s in a private mount namespace: %v", run, err)
	}
	if !strings.Contains(string(out), "--- PASS: ") {
		t.Fatalf("%s in a private mount namespace did not pass", run)
	}
}
