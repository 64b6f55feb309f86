// Package lab builds a whole cluster in network namespaces on this machine,
// without containers or VMs, for the end-to-end tests and `make demo`.
//
// Layout (all names start with the run's prefix, nothing lives in the host's
// own network namespace):
//
//	<prefix>-underlay  one Linux bridge per node subnet ("segment"); every node
//	                   and the router plug a veth into it
//	<prefix>-router    a leg on every segment (the segment's first address) and
//	                   one towards the outside; forwards between them
//	<prefix>-outside   203.0.113.10, standing for the internet
//	<prefix>-<node>    one per node: eth0 on its segment, default route via the
//	                   router; processes of the node run in this namespace and
//	                   in the node's cgroup (v2)
//	<prefix>-<node>-<pod>  one per pod, attached by the real CNI plugin
//
// A run leaves a record in /run/podnet-lab so that the next run can remove
// what a crashed one left behind, and so that `podnet-lab down` finds labs
// that were kept on purpose.
package lab

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/atomicfile"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/roottest"
)

// FamilyPrefix starts every default run prefix; stale objects of crashed runs
// are recognised by it.
const FamilyPrefix = "pn"

// Fixed addresses of the lab. The IPv6 ones (Options.Families) are unique
// local addresses (fd00::/8), never global ones: segment 192.168.X.0/24
// is fd00:10:X::/64 beside it, a node's address ends in its IPv4
// address's last byte, the i-th node's pods are fd00:10:244:i::/64.
var (
	ClusterCIDR  = netip.MustParsePrefix("10.244.0.0/16")
	ClusterCIDR6 = netip.MustParsePrefix("fd00:10:244::/56")
	// OutsideNet6 links the router to the outside over IPv6.
	OutsideNet6 = netip.MustParsePrefix("fd00:203::/64")
	outsideGW6  = netip.MustParseAddr("fd00:203::1")
	outsideIP6  = netip.MustParseAddr("fd00:203::10")
	// OutsideNet links the router to the outside namespace.
	OutsideNet = netip.MustParsePrefix("203.0.113.0/24")
	outsideGW  = netip.MustParseAddr("203.0.113.1")
	outsideIP  = netip.MustParseAddr("203.0.113.10")
)

// UnderlayMTU is the MTU of every underlay link.
const UnderlayMTU = 1500

// Options say what to build. The zero value builds the default four-node lab.
type Options struct {
	// Prefix names everything of this run. Default: "pn" + 4 random hex digits.
	Prefix string
	// Nodes default to node1..node3 on 192.168.10.11-13/24 (segment A) and
	// node4 on 192.168.20.11/24 (segment B).
	Nodes []NodeSpec
	// BinDir holds podnet, proxyd and dnsd. Default: $PODNET_BIN, else the
	// directory of the running podnet-lab binary, else <repo>/bin.
	BinDir string
	// WorkDir holds the run's files. Default: a temporary directory, removed
	// by Close.
	WorkDir string
	// Logf reports progress; nil discards it.
	Logf func(format string, args ...any)
	// Detached lets processes started in the lab outlive this process, for
	// a lab that is kept up (Keep) after it exits. Otherwise they die with
	// it. Close and Down end them either way, through the node cgroups.
	Detached bool
	// Families are the address families of the cluster: the pods'
	// (podCIDRs) and the nodes' InternalIPs, in this order (the first is
	// the family VXLAN runs over). Empty: IPv4. With IPv6 the underlay,
	// the router and the outside get IPv6 addresses too.
	Families []ipfamily.Family
}

// NodeSpec describes one node.
type NodeSpec struct {
	Name string
	// IP is the node's underlay address with its subnet, e.g. 192.168.10.11/24.
	// Nodes sharing a subnet share an L2 segment; the subnet's first address
	// is the router.
	IP netip.Prefix
	// PodCIDR defaults to 10.244.<i>.0/24 for the i-th node (from 1).
	PodCIDR netip.Prefix
	// Zone is its topology.kubernetes.io/zone; empty: its segment's.
	Zone string
}

// DefaultNodes is the default topology.
func DefaultNodes() []NodeSpec {
	return []NodeSpec{
		{Name: "node1", IP: netip.MustParsePrefix("192.168.10.11/24")},
		{Name: "node2", IP: netip.MustParsePrefix("192.168.10.12/24")},
		{Name: "node3", IP: netip.MustParsePrefix("192.168.10.13/24")},
		{Name: "node4", IP: netip.MustParsePrefix("192.168.20.11/24")},
	}
}

// Lab is a running lab. Close removes all of it.
type Lab struct {
	Prefix   string
	Underlay string // netns names
	Router   string
	Outside  string
	// OutsideIP is the address of the outside namespace; OutsideIP6 its
	// IPv6 one when the lab has IPv6.
	OutsideIP  netip.Addr
	OutsideIP6 netip.Addr
	// Families are Options.Families (IPv4 when none were given).
	Families []ipfamily.Family
	Nodes    []*Node
	// OutsideHost runs processes in the outside namespace (a client on the
	// internet, an upstream DNS server). Only its Exec, Start, Ping, Probe
	// and StartEcho are meaningful; it has no pods.
	OutsideHost *Node
	Segments    []Segment
	BinDir      string
	WorkDir     string

	logf        func(format string, args ...any)
	detached    bool
	ownsWorkDir bool
	cgroupRoot  string

	mu     sync.Mutex
	procs  []*Proc
	pods   []*Pod
	closed bool

	closeOnce sync.Once
	closeErr  error
}

// Segment is one underlay L2 segment: a bridge in the underlay namespace and
// a router leg.
type Segment struct {
	Subnet  netip.Prefix
	Gateway netip.Addr // the router's address on it
	Bridge  string     // bridge name in the underlay namespace
	Zone    string     // topology.kubernetes.io/zone of its nodes
}

// Gateway6 is the router's IPv6 address on the segment, in a lab with IPv6.
func (s Segment) Gateway6() netip.Addr { return hostIn(ula6(s.Subnet), 1) }

// Node is one node of the lab.
type Node struct {
	Name    string
	NS      string // netns name
	IP      netip.Addr
	Subnet  netip.Prefix
	Gateway netip.Addr
	Iface   string // underlay interface inside the node: "eth0"
	PodCIDR netip.Prefix
	// IP6, Subnet6, Gateway6 and PodCIDR6 are the IPv6 ones, valid when
	// the lab has IPv6.
	IP6      netip.Addr
	Subnet6  netip.Prefix
	Gateway6 netip.Addr
	PodCIDR6 netip.Prefix
	Zone     string
	// Dir holds the node's files: node.json, ipam, logs, the CNI cache.
	Dir string
	// Cgroup is the node's cgroup v2 directory; every process of the node
	// (and of its pods) runs in it.
	Cgroup string

	lab *Lab
}

// New builds a lab. Stale labs of crashed runs are removed first. On error
// everything built so far is removed again.
func New(ctx context.Context, o Options) (*Lab, error) {
	start := time.Now()
	cgroupRoot, err := cgroup2Root()
	if err != nil {
		return nil, err
	}
	l, err := newLab(o, cgroupRoot)
	if err != nil {
		return nil, err
	}
	if err := sweepStale(l.logf); err != nil {
		l.logf("lab: removing stale labs: %v", err)
	}
	if err := writeRecord(runRecord{Prefix: l.Prefix, WorkDir: l.WorkDir, OwnsWorkDir: l.ownsWorkDir}); err != nil {
		if l.ownsWorkDir {
			os.RemoveAll(l.WorkDir)
		}
		return nil, err
	}
	if err := l.build(ctx); err != nil {
		logs := l.Logs()
		if cerr := l.Close(); cerr != nil {
			err = errors.Join(err, cerr)
		}
		if logs != "" {
			err = fmt.Errorf("%w\n%s", err, logs)
		}
		return nil, err
	}
	l.logf("lab %s: %d nodes up in %v (workdir %s)", l.Prefix, len(l.Nodes), time.Since(start).Round(time.Millisecond), l.WorkDir)
	return l, nil
}

// Start is New for tests: it fails t on error and closes the lab when the
// test ends, logging what the lab's processes printed if the test failed.
func Start(t testing.TB, o Options) *Lab {
	t.Helper()
	roottest.Require(t)
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := New(ctx, o)
	if err != nil {
		t.Fatalf("start lab: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if logs := l.Logs(); logs != "" {
				t.Logf("lab %s logs:\n%s", l.Prefix, logs)
			}
		}
		if err := l.Close(); err != nil {
			t.Errorf("close lab: %v", err)
		}
	})
	return l
}

// newLab fills in the defaults and plans the lab; it creates nothing but
// the work dir.
func newLab(o Options, cgroupRoot string) (*Lab, error) {
	l := &Lab{Prefix: o.Prefix, BinDir: o.BinDir, WorkDir: o.WorkDir, logf: o.Logf, detached: o.Detached, OutsideIP: outsideIP, Families: o.Families}
	if len(l.Families) == 0 {
		l.Families = []ipfamily.Family{ipfamily.IPv4}
	}
	if l.Has(ipfamily.IPv6) {
		l.OutsideIP6 = outsideIP6
	}
	if l.logf == nil {
		l.logf = func(string, ...any) {}
	}
	if l.Prefix == "" {
		b := make([]byte, 2)
		if _, err := rand.Read(b); err != nil {
			return nil, fmt.Errorf("random prefix: %w", err)
		}
		l.Prefix = FamilyPrefix + hex.EncodeToString(b)
	}
	if err := validName("prefix", l.Prefix); err != nil {
		return nil, err
	}
	if l.BinDir == "" {
		l.BinDir = defaultBinDir()
	}
	l.cgroupRoot = cgroupRoot
	l.Underlay = l.Prefix + "-underlay"
	l.Router = l.Prefix + "-router"
	l.Outside = l.Prefix + "-outside"

	l.OutsideHost = &Node{
		Name: "outside", NS: l.Outside, IP: outsideIP, Subnet: OutsideNet, Gateway: outsideGW, Iface: "eth0",
		Cgroup: filepath.Join(l.cgroupRoot, "podnet-"+l.Prefix+"-outside"),
		lab:    l,
	}
	if err := l.planNodes(o.Nodes); err != nil {
		return nil, err
	}
	// Last, so that invalid options leave nothing behind.
	if err := l.makeWorkDir(); err != nil {
		return nil, err
	}
	return l, nil
}

// planNodes validates specs (DefaultNodes when empty) and adds a Node for
// each, with the segments their subnets need.
func (l *Lab) planNodes(specs []NodeSpec) error {
	if len(specs) == 0 {
		specs = DefaultNodes()
	}
	if len(specs) > 254 {
		return fmt.Errorf("nodes: %d, at most 254", len(specs))
	}
	seen := map[string]bool{}
	for i, s := range specs {
		if err := validName("node name", s.Name); err != nil {
			return err
		}
		if seen[s.Name] || s.Name == "underlay" || s.Name == "router" || s.Name == "outside" {
			return fmt.Errorf("node name %q: duplicate or reserved", s.Name)
		}
		seen[s.Name] = true
		n, err := l.planNode(i, s)
		if err != nil {
			return err
		}
		l.Nodes = append(l.Nodes, n)
	}
	for i, a := range l.Segments {
		for _, b := range l.Segments[i+1:] {
			if a.Subnet.Overlaps(b.Subnet) {
				return fmt.Errorf("nodes: subnets %v and %v overlap", a.Subnet, b.Subnet)
			}
		}
	}
	return nil
}

// planNode checks one node's addresses and places it on its segment; the
// i-th node gets 10.244.(i+1).0/24 unless its spec names a podCIDR.
func (l *Lab) planNode(i int, s NodeSpec) (*Node, error) {
	if !s.IP.IsValid() || !s.IP.Addr().Is4() || s.IP.Bits() > 30 {
		return nil, fmt.Errorf("node %s: ip %v: want an IPv4 address with a subnet of /30 or larger", s.Name, s.IP)
	}
	pod := s.PodCIDR
	if !pod.IsValid() {
		pod = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}), 24)
	}
	if s.IP.Masked().Overlaps(OutsideNet) {
		return nil, fmt.Errorf("node %s: ip %v: overlaps the outside network %v", s.Name, s.IP, OutsideNet)
	}
	seg := l.segmentFor(s.IP.Masked())
	if s.IP.Addr() == seg.Gateway || s.IP.Addr() == s.IP.Masked().Addr() {
		return nil, fmt.Errorf("node %s: ip %v is the router's or the subnet's address", s.Name, s.IP)
	}
	zone := seg.Zone
	if s.Zone != "" {
		zone = s.Zone
	}
	n := &Node{
		Name: s.Name, NS: l.Prefix + "-" + s.Name, IP: s.IP.Addr(), Subnet: s.IP.Masked(),
		Gateway: seg.Gateway, Iface: "eth0", PodCIDR: pod, Zone: zone,
		Cgroup: filepath.Join(l.cgroupRoot, "podnet-"+l.Prefix+"-"+s.Name),
		lab:    l,
	}
	if l.Has(ipfamily.IPv6) {
		n.Subnet6 = ula6(n.Subnet)
		n.IP6, n.Gateway6 = hostIn(n.Subnet6, n.IP.As4()[3]), hostIn(n.Subnet6, 1)
		n.PodCIDR6, _ = ipfamily.Subnet(ClusterCIDR6, 64, uint64(i+1))
	}
	return n, nil
}

// Has reports whether the lab's cluster has family f.
func (l *Lab) Has(f ipfamily.Family) bool { return slices.Contains(l.Families, f) }

// ula6 is the IPv6 segment beside the IPv4 segment 192.168.X.0/24:
// fd00:10:X::/64.
func ula6(v4 netip.Prefix) netip.Prefix {
	b := v4.Addr().As4()
	return netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0, b[2]}), 64)
}

// hostIn is the address of subnet p ending in the byte last.
func hostIn(p netip.Prefix, last byte) netip.Addr {
	b := p.Addr().As16()
	b[15] = last
	return netip.AddrFrom16(b)
}

// PodCIDRs are the node's podCIDRs, in the lab's family order.
func (n *Node) PodCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, f := range n.lab.Families {
		if f == ipfamily.IPv6 {
			out = append(out, n.PodCIDR6)
		} else {
			out = append(out, n.PodCIDR)
		}
	}
	return out
}

// InternalIPs are the node's InternalIPs, in the lab's family order.
func (n *Node) InternalIPs() []netip.Addr {
	var out []netip.Addr
	for _, f := range n.lab.Families {
		if f == ipfamily.IPv6 {
			out = append(out, n.IP6)
		} else {
			out = append(out, n.IP)
		}
	}
	return out
}

// ClusterCIDRs are the lab's cluster CIDRs, in its family order: what
// proxyd's --cluster-cidr takes, comma-separated.
func (l *Lab) ClusterCIDRs() []netip.Prefix {
	var out []netip.Prefix
	for _, f := range l.Families {
		if f == ipfamily.IPv6 {
			out = append(out, ClusterCIDR6)
		} else {
			out = append(out, ClusterCIDR)
		}
	}
	return out
}

// makeWorkDir creates the work dir (a fresh temporary one unless the
// options named one) and sets the outside host's and the nodes' dirs in it.
func (l *Lab) makeWorkDir() error {
	if l.WorkDir == "" {
		dir, err := os.MkdirTemp("", "podnet-lab-"+l.Prefix+"-")
		if err != nil {
			return fmt.Errorf("create work dir: %w", err)
		}
		l.WorkDir, l.ownsWorkDir = dir, true
	} else if err := os.MkdirAll(l.WorkDir, 0o755); err != nil {
		return fmt.Errorf("create work dir: %w", err)
	}
	l.OutsideHost.Dir = filepath.Join(l.WorkDir, "outside")
	for _, n := range l.Nodes {
		n.Dir = filepath.Join(l.WorkDir, "nodes", n.Name)
	}
	return nil
}

// segmentFor returns the segment of subnet, adding it if it is new.
func (l *Lab) segmentFor(subnet netip.Prefix) Segment {
	for _, s := range l.Segments {
		if s.Subnet == subnet {
			return s
		}
	}
	i := len(l.Segments)
	s := Segment{
		Subnet:  subnet,
		Gateway: subnet.Addr().Next(),
		Bridge:  fmt.Sprintf("br%d", i),
		Zone:    fmt.Sprintf("zone-%c", 'a'+i%26),
	}
	l.Segments = append(l.Segments, s)
	return s
}

func (l *Lab) build(ctx context.Context) error {
	if err := os.MkdirAll(l.StateDir(), 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	for _, n := range l.hosts() {
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return fmt.Errorf("create node dir: %w", err)
		}
		if err := os.Mkdir(n.Cgroup, 0o755); err != nil {
			return fmt.Errorf("create cgroup of %s: %w", n.Name, err)
		}
	}
	if err := l.mountBPF(); err != nil {
		return err
	}
	if err := l.buildNetwork(ctx); err != nil {
		return err
	}
	return l.writeClusterState()
}

// hosts are the nodes and the outside host: everything with a cgroup.
func (l *Lab) hosts() []*Node { return append(slices.Clone(l.Nodes), l.OutsideHost) }

// Node returns the node called name, or nil.
func (l *Lab) Node(name string) *Node {
	for _, n := range l.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// StateDir is the control plane's state directory: proxyd and dnsd read it
// with --state-dir.
func (l *Lab) StateDir() string { return filepath.Join(l.WorkDir, "state") }

// WriteState atomically writes file (relative to StateDir) with yamlText.
func (l *Lab) WriteState(file, yamlText string) error {
	p, err := l.statePath(file)
	if err != nil {
		return err
	}
	return atomicfile.WriteFile(p, []byte(yamlText), 0o644)
}

// RemoveState removes file (relative to StateDir). A missing file is no error.
func (l *Lab) RemoveState(file string) error {
	p, err := l.statePath(file)
	if err != nil {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove state file: %w", err)
	}
	return nil
}

func (l *Lab) statePath(file string) (string, error) {
	if !filepath.IsLocal(file) {
		return "", fmt.Errorf("state file %q: must be a relative path inside the state dir", file)
	}
	return filepath.Join(l.StateDir(), file), nil
}

// Namespaces lists every network namespace of the lab, pods first.
func (l *Lab) Namespaces() []string {
	l.mu.Lock()
	var names []string
	for _, p := range l.pods {
		names = append(names, p.NS)
	}
	l.mu.Unlock()
	for _, n := range l.Nodes {
		names = append(names, n.NS)
	}
	return append(names, l.Outside, l.Router, l.Underlay)
}

// Logs returns what the lab's processes printed, and each node's CNI log,
// for failure messages.
func (l *Lab) Logs() string {
	var b strings.Builder
	l.mu.Lock()
	procs := slices.Clone(l.procs)
	l.mu.Unlock()
	for _, p := range procs {
		fmt.Fprintf(&b, "=== %s (pid %d, %s)\n%s\n", p.name, p.Pid(), p.state(), tail(p.Output(), 8<<10))
	}
	for _, n := range l.Nodes {
		if data, err := os.ReadFile(filepath.Join(n.Dir, "cni.log")); err == nil && len(data) > 0 {
			fmt.Fprintf(&b, "=== %s cni.log\n%s\n", n.Name, tail(string(data), 8<<10))
		}
	}
	return b.String()
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// Close removes everything of the lab: processes, namespaces, cgroups, the
// work dir (if the lab created it) and the run record. It is safe to call
// more than once.
func (l *Lab) Close() error {
	l.closeOnce.Do(func() {
		l.mu.Lock()
		l.closed = true
		procs := slices.Clone(l.procs)
		l.mu.Unlock()
		var errs []error
		// Killing whole cgroups ends every process at once, including
		// those that forked away from the ones the lab started.
		for _, p := range procs {
			p.signalled.Store(true)
		}
		// Not while InCgroup has this process in a node's cgroup: the
		// kill would take the caller along.
		cgroupMove.Lock()
		for _, n := range l.hosts() {
			if err := removeCgroup(n.Cgroup); err != nil {
				errs = append(errs, err)
			}
		}
		cgroupMove.Unlock()
		for _, p := range procs {
			p.kill()
		}
		for _, name := range l.Namespaces() {
			if err := deleteNetns(name); err != nil {
				errs = append(errs, err)
			}
		}
		if err := unmountUnder(l.WorkDir); err != nil {
			errs = append(errs, err)
		}
		if l.ownsWorkDir {
			if err := os.RemoveAll(l.WorkDir); err != nil {
				errs = append(errs, fmt.Errorf("remove work dir: %w", err))
			}
		}
		if len(errs) == 0 {
			if err := removeRecord(l.Prefix); err != nil {
				errs = append(errs, err)
			}
		}
		l.closeErr = errors.Join(errs...)
	})
	return l.closeErr
}

// Keep leaves the lab up after this process exits and marks it so that
// `podnet-lab down` (Down) removes it and no later New treats it as stale.
// Processes of the lab die when this process exits unless the lab was
// built with Options.Detached.
func (l *Lab) Keep() error {
	return writeRecord(runRecord{Prefix: l.Prefix, WorkDir: l.WorkDir, OwnsWorkDir: l.ownsWorkDir, Kept: true, Namespaces: l.Namespaces()})
}

// NodeConfigPath is where the node's proxyd writes its node config and the
// CNI plugin reads it.
func (n *Node) NodeConfigPath() string { return filepath.Join(n.Dir, "node.json") }

// WriteNodeConfig writes the node config itself, for tests that run the CNI
// plugin without proxyd. The MTU is the underlay's: without proxyd there is
// no VXLAN overhead to subtract.
func (n *Node) WriteNodeConfig() error {
	return nodeconfig.Write(n.NodeConfigPath(), nodeconfig.New(n.PodCIDRs(), n.lab.ClusterCIDRs(), UnderlayMTU))
}

// NSPath is the path of the node's network namespace.
func (n *Node) NSPath() string { return netnsPath(n.NS) }

// validName accepts what fits into namespace, cgroup and interface names.
func validName(what, s string) error {
	if s == "" || len(s) > 15 {
		return fmt.Errorf("%s %q: want 1-15 characters", what, s)
	}
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return fmt.Errorf("%s %q: only a-z, 0-9 and _ allowed", what, s)
		}
	}
	return nil
}

func defaultBinDir() string {
	if d := os.Getenv("PODNET_BIN"); d != "" {
		return d
	}
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		if _, err := os.Stat(filepath.Join(dir, "podnet")); err == nil {
			return dir
		}
	}
	dir, err := os.Getwd()
	if err != nil {
		return "bin"
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Join(d, "bin")
		}
		if filepath.Dir(d) == d {
			return filepath.Join(dir, "bin")
		}
	}
}
