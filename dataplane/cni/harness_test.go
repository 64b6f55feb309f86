package cni

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/roottest"
)

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	tmpRoot   string
)

func TestMain(m *testing.M) {
	code := m.Run()
	if tmpRoot != "" {
		os.RemoveAll(tmpRoot)
	}
	os.Exit(code)
}

// referencePackages are the reference plugins the Makefile builds into bin/
// and `podnet install` installs beside podnet.
var referencePackages = map[string]string{
	LoopbackName: "github.com/containernetworking/plugins/plugins/main/loopback",
	PortmapName:  "github.com/containernetworking/plugins/plugins/meta/portmap",
}

// pluginDir returns a directory holding the podnet binary and the reference
// plugins: $PODNET_BIN (the Makefile's bin/) if it has podnet, else fresh
// `go build`s of cmd/cni-plugin and referencePackages.
func pluginDir(t testing.TB) string {
	t.Helper()
	if d := os.Getenv("PODNET_BIN"); d != "" {
		// The Makefile's bin/ directory, or the binary itself.
		if filepath.Base(d) == "podnet" {
			d = filepath.Dir(d)
		}
		if st, err := os.Stat(filepath.Join(d, "podnet")); err == nil && st.Mode().IsRegular() {
			return d
		}
	}
	buildOnce.Do(func() {
		tmpRoot, buildErr = os.MkdirTemp("", "podnet-cni-test-")
		if buildErr != nil {
			return
		}
		buildDir = filepath.Join(tmpRoot, "bin")
		pkgs := map[string]string{"podnet": "github.com/podnet/podnet/cmd/cni-plugin"}
		maps.Copy(pkgs, referencePackages)
		for name, pkg := range pkgs {
			out, err := exec.Command("go", "build", "-o", filepath.Join(buildDir, name), pkg).CombinedOutput()
			if err != nil {
				buildErr = fmt.Errorf("go build %s: %v\n%s", pkg, err, out)
				return
			}
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

var nsSeq atomic.Int64

// nsPrefix makes namespace names unique per test run.
var nsPrefix = fmt.Sprintf("pncni%d-", os.Getpid())

// newNetNS creates a named network namespace, removed in t.Cleanup. The
// thread that creates it is locked and discarded, so no other goroutine ever
// runs in a namespace it did not ask for.
func newNetNS(t testing.TB, role string) ns.NetNS {
	t.Helper()
	name := fmt.Sprintf("%s%s%d", nsPrefix, role, nsSeq.Add(1))
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread exits with the goroutine
		h, err := netns.NewNamed(name)
		if err == nil {
			h.Close()
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		t.Fatalf("create netns %s: %v", name, err)
	}
	path := filepath.Join("/run/netns", name)
	n, err := ns.GetNS(path)
	if err != nil {
		netns.DeleteNamed(name)
		t.Fatalf("open netns %s: %v", name, err)
	}
	t.Cleanup(func() {
		n.Close()
		if err := netns.DeleteNamed(name); err != nil && !errors.Is(err, os.ErrNotExist) && !errors.Is(err, unix.EINVAL) {
			t.Errorf("delete netns %s: %v", name, err)
		}
	})
	return n
}

// deleteNetNS removes a namespace before the end of the test, as a runtime
// does when a sandbox goes away.
func deleteNetNS(t testing.TB, n ns.NetNS) {
	t.Helper()
	path := n.Path()
	n.Close()
	if err := netns.DeleteNamed(filepath.Base(path)); err != nil {
		t.Fatalf("delete netns %s: %v", path, err)
	}
}

// testNode is a node namespace with its own plugin config, IPAM dir, libcni
// cache and boot ID file.
type testNode struct {
	t       testing.TB
	ns      ns.NetNS
	dir     string
	cni     *libcni.CNIConfig
	list    *libcni.NetworkConfigList
	version string
}

type nodeOptions struct {
	version string
	podCIDR string // written to node.json unless noNodeConfig
	mtu     int
	// noNodeConfig leaves node.json unwritten (STATUS tests).
	noNodeConfig bool
	// plugin adds or overrides fields of the plugin entry.
	plugin map[string]any
}

func newTestNode(t testing.TB, o nodeOptions) *testNode {
	t.Helper()
	roottest.Require(t)
	if o.version == "" {
		o.version = "1.1.0"
	}
	if o.podCIDR == "" {
		o.podCIDR = "10.244.1.0/24"
	}
	if o.mtu == 0 {
		o.mtu = 1450
	}
	n := &testNode{t: t, ns: newNetNS(t, "node"), dir: t.TempDir(), version: o.version}
	if !o.noNodeConfig {
		n.writeNodeConfig(o.podCIDR, o.mtu)
	}
	n.setBootID("boot-1")
	plugin := map[string]any{
		"type":       "podnet",
		"nodeConfig": filepath.Join(n.dir, "node.json"),
		"dataDir":    filepath.Join(n.dir, "ipam"),
		"logFile":    filepath.Join(n.dir, "cni.log"),
		"bootIDFile": filepath.Join(n.dir, "boot_id"),
	}
	for k, v := range o.plugin {
		plugin[k] = v
	}
	conf, err := json.Marshal(map[string]any{
		"cniVersion": o.version,
		"name":       "podnet",
		"plugins":    []any{plugin},
	})
	if err != nil {
		t.Fatal(err)
	}
	n.list, err = libcni.NetworkConfFromBytes(conf)
	if err != nil {
		t.Fatalf("parse conflist: %v", err)
	}
	n.cni = libcni.NewCNIConfigWithCacheDir([]string{pluginDir(t)}, filepath.Join(n.dir, "cache"), newExec())
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(filepath.Join(n.dir, "cni.log")); err == nil {
				t.Logf("plugin log:\n%s", tail(log, 4000))
			}
		}
	})
	return n
}

// newExec is libcni's default exec, made up front: libcni creates it lazily
// without a lock, which races when one CNIConfig is used concurrently.
func newExec() invoke.Exec {
	return &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: os.Stderr}, PluginDecoder: version.PluginDecoder{}}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// writeNodeConfig writes node.json with podCIDRs, one prefix or one per
// family separated by a comma, in the cluster CIDRs 10.0.0.0/8 and fd00::/8.
func (n *testNode) writeNodeConfig(podCIDRs string, mtu int) {
	n.t.Helper()
	var pods, clusters []netip.Prefix
	for _, s := range strings.Split(podCIDRs, ",") {
		p := netip.MustParsePrefix(s)
		pods = append(pods, p)
		clusters = append(clusters, map[bool]netip.Prefix{true: netip.MustParsePrefix("10.0.0.0/8"), false: netip.MustParsePrefix("fd00::/8")}[p.Addr().Is4()])
	}
	err := nodeconfig.Write(filepath.Join(n.dir, "node.json"), nodeconfig.New(pods, clusters, mtu))
	if err != nil {
		n.t.Fatal(err)
	}
}

func (n *testNode) setBootID(id string) {
	n.t.Helper()
	if err := os.WriteFile(filepath.Join(n.dir, "boot_id"), []byte(id+"\n"), 0o644); err != nil {
		n.t.Fatal(err)
	}
}

func rt(pod ns.NetNS, cid, ifname string) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: cid, NetNS: pod.Path(), IfName: ifname}
}

// inNode runs fn on a thread in the node namespace, so the plugin processes
// libcni execs from it start there.
func (n *testNode) inNode(fn func() error) error {
	return n.ns.Do(func(ns.NetNS) error { return fn() })
}

func (n *testNode) addCtx(ctx context.Context, pod ns.NetNS, cid, ifname string) (types.Result, error) {
	var res types.Result
	err := n.inNode(func() error {
		var err error
		res, err = n.cni.AddNetworkList(ctx, n.list, rt(pod, cid, ifname))
		return err
	})
	return res, err
}

func (n *testNode) add(pod ns.NetNS, cid, ifname string) (types.Result, error) {
	return n.addCtx(context.Background(), pod, cid, ifname)
}

// mustAdd adds and returns the result converted to the current version.
func (n *testNode) mustAdd(pod ns.NetNS, cid, ifname string) *current.Result {
	n.t.Helper()
	res, err := n.add(pod, cid, ifname)
	if err != nil {
		n.t.Fatalf("ADD %s/%s: %v", cid, ifname, err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		n.t.Fatalf("convert result: %v", err)
	}
	return cur
}

func (n *testNode) del(pod ns.NetNS, cid, ifname string) error {
	return n.inNode(func() error {
		r := &libcni.RuntimeConf{ContainerID: cid, IfName: ifname}
		if pod != nil {
			r.NetNS = pod.Path()
		}
		return n.cni.DelNetworkList(context.Background(), n.list, r)
	})
}

func (n *testNode) check(pod ns.NetNS, cid, ifname string) error {
	return n.inNode(func() error {
		return n.cni.CheckNetworkList(context.Background(), n.list, rt(pod, cid, ifname))
	})
}

func (n *testNode) status() error {
	return n.inNode(func() error { return n.cni.GetStatusNetworkList(context.Background(), n.list) })
}

// gc runs GC with the given valid attachments. With freshCache, libcni has
// no cached attachments to DEL itself, so only the plugin's GC acts.
func (n *testNode) gc(valid []types.GCAttachment, freshCache bool) error {
	c := n.cni
	if freshCache {
		c = libcni.NewCNIConfigWithCacheDir([]string{pluginDir(n.t)}, n.t.TempDir(), newExec())
	}
	return n.inNode(func() error {
		return c.GCNetworkList(context.Background(), n.list, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// allocations reads the IPAM store the way the plugin does.
func (n *testNode) allocations() []ipam.Allocation {
	n.t.Helper()
	txn, err := ipam.Open(ipam.Options{Dir: filepath.Join(n.dir, "ipam", "podnet"), BootIDFile: filepath.Join(n.dir, "boot_id")})
	if err != nil {
		n.t.Fatal(err)
	}
	defer txn.Close()
	return txn.Allocations()
}

// cniCode returns the CNI error code of err, or 0 if it is not a CNI error.
func cniCode(err error) uint {
	var e *types.Error
	if errors.As(err, &e) {
		return e.Code
	}
	return 0
}

// podAddr returns the address of the result's pod interface.
func podAddr(t testing.TB, r *current.Result) netip.Addr {
	t.Helper()
	if len(r.IPs) != 1 {
		t.Fatalf("result has %d IPs, want 1: %v", len(r.IPs), r)
	}
	a, ok := netip.AddrFromSlice(r.IPs[0].Address.IP)
	if !ok {
		t.Fatalf("bad IP in result: %v", r.IPs[0])
	}
	return a.Unmap()
}

// ping sends ICMP echo requests from inside from to dst and waits for a
// reply; a bounded number of tries.
// For IPv6 the kernel fills in the ICMPv6 checksum of a raw socket.
func ping(from ns.NetNS, dst netip.Addr) error {
	return from.Do(func(ns.NetNS) error {
		network, any, request, reply := "ip4:icmp", "0.0.0.0", byte(8), byte(0)
		if dst.Is6() {
			network, any, request, reply = "ip6:ipv6-icmp", "::", 128, 129
		}
		c, err := net.ListenPacket(network, any)
		if err != nil {
			return err
		}
		defer c.Close()
		id := uint16(os.Getpid())
		buf := make([]byte, 1500)
		for seq := uint16(1); seq <= 5; seq++ {
			msg := []byte{request, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 'p', 'o', 'd', 'n', 'e', 't'}
			if dst.Is4() {
				cs := icmpChecksum(msg)
				msg[2], msg[3] = byte(cs>>8), byte(cs)
			}
			if _, err := c.WriteTo(msg, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
				return err
			}
			deadline := time.Now().Add(time.Second)
			c.SetReadDeadline(deadline)
			for {
				nr, peer, err := c.ReadFrom(buf)
				if err != nil {
					break // timeout: next try
				}
				ip := peer.(*net.IPAddr).IP
				if nr >= 8 && buf[0] == reply && ip.Equal(dst.AsSlice()) && buf[4] == byte(id>>8) && buf[5] == byte(id) {
					return nil
				}
			}
		}
		return fmt.Errorf("no echo reply from %s", dst)
	})
}

func icmpChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return ^uint16(s)
}
