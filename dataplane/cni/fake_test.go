package cni

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/link"
)

// fakeHost keeps links and addresses in memory and fails like the kernel
// does: no veth onto a missing bridge, no second link of one name, no
// address on a missing link. failOn makes one method fail.
type fakeHost struct {
	failOn     string
	links      map[string]*fakeLink
	nextIndex  int
	forwarding bool
}

type fakeLink struct {
	kind   string
	index  int
	mtu    int
	mac    net.HardwareAddr
	master int
	addrs  []netip.Prefix
	podIf  string // for a host veth: the pod side's name
	pod    *link.PodIface
}

func newFakeHost() *fakeHost { return &fakeHost{links: map[string]*fakeLink{}, nextIndex: 1} }

var errInjected = errors.New("injected failure")

func (f *fakeHost) fail(method string) error {
	if f.failOn == method {
		return fmt.Errorf("%s: %w", method, errInjected)
	}
	return nil
}

func (f *fakeHost) attrs(name string) *netlink.Bridge {
	l := f.links[name]
	return &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name, Index: l.index, MTU: l.mtu, HardwareAddr: l.mac}}
}

func (f *fakeHost) OpenNetNS(path string) (ns.NetNS, error) {
	if err := f.fail("OpenNetNS"); err != nil {
		return nil, err
	}
	return fakeNS(path), nil
}

func (f *fakeHost) Bridge(name string, mtu int, mac net.HardwareAddr) (netlink.Link, error) {
	if err := f.fail("Bridge"); err != nil {
		return nil, err
	}
	l, ok := f.links[name]
	if !ok {
		l = &fakeLink{kind: "bridge", index: f.nextIndex, mtu: mtu, mac: mac}
		f.nextIndex++
		f.links[name] = l
	} else if l.kind != "bridge" {
		return nil, fmt.Errorf("%s exists and is a %s device, not a bridge", name, l.kind)
	}
	return f.attrs(name), nil
}

func (f *fakeHost) link(l netlink.Link) (*fakeLink, error) {
	fl, ok := f.links[l.Attrs().Name]
	if !ok {
		return nil, fmt.Errorf("link %s: no such device", l.Attrs().Name)
	}
	return fl, nil
}

func (f *fakeHost) SetMTU(l netlink.Link, mtu int) error {
	if err := f.fail("SetMTU"); err != nil {
		return err
	}
	fl, err := f.link(l)
	if err == nil {
		fl.mtu = mtu
	}
	return err
}

func (f *fakeHost) SetMAC(l netlink.Link, mac net.HardwareAddr) error {
	if err := f.fail("SetMAC"); err != nil {
		return err
	}
	fl, err := f.link(l)
	if err == nil {
		fl.mac = mac
	}
	return err
}

func (f *fakeHost) Addrs(l netlink.Link, family int) ([]netip.Prefix, error) {
	if err := f.fail("Addrs"); err != nil {
		return nil, err
	}
	fl, err := f.link(l)
	if err != nil {
		return nil, err
	}
	return slices.Clone(fl.addrs), nil
}

func (f *fakeHost) AddAddr(l netlink.Link, p netip.Prefix) error {
	if err := f.fail("AddAddr"); err != nil {
		return err
	}
	fl, err := f.link(l)
	if err == nil && !slices.Contains(fl.addrs, p) {
		fl.addrs = append(fl.addrs, p)
	}
	return err
}

func (f *fakeHost) DelAddr(l netlink.Link, p netip.Prefix) error {
	if err := f.fail("DelAddr"); err != nil {
		return err
	}
	fl, err := f.link(l)
	if err == nil {
		fl.addrs = slices.DeleteFunc(fl.addrs, func(a netip.Prefix) bool { return a == p })
	}
	return err
}

func (f *fakeHost) AddVeth(o link.VethOptions) error {
	if err := f.fail("AddVeth"); err != nil {
		return err
	}
	br, ok := f.links[o.Bridge.Attrs().Name]
	if !ok || br.index != o.Bridge.Attrs().Index {
		return fmt.Errorf("master %s: no such device", o.Bridge.Attrs().Name)
	}
	if old, ok := f.links[o.HostName]; ok && old.podIf == o.PodName {
		delete(f.links, o.HostName) // a repeated ADD replaces its pair
	}
	if _, ok := f.links[o.HostName]; ok {
		return fmt.Errorf("create veth %s: file exists", o.HostName)
	}
	f.links[o.HostName] = &fakeLink{kind: "veth", index: f.nextIndex, mtu: o.MTU, mac: o.HostMAC, master: br.index, podIf: o.PodName}
	f.nextIndex++
	return nil
}

func (f *fakeHost) DelLink(name string) (bool, error) {
	if err := f.fail("DelLink"); err != nil {
		return false, err
	}
	_, ok := f.links[name]
	delete(f.links, name)
	return ok, nil
}

func (f *fakeHost) HostVeths() ([]string, error) {
	if err := f.fail("HostVeths"); err != nil {
		return nil, err
	}
	var out []string
	for name, l := range f.links {
		if l.kind == "veth" && link.IsHostVethName(name) {
			out = append(out, name)
		}
	}
	return out, nil
}

func (f *fakeHost) ConfigurePod(podNS ns.NetNS, p link.PodIface) error {
	if err := f.fail("ConfigurePod"); err != nil {
		return err
	}
	for _, l := range f.links {
		if l.kind == "veth" && l.podIf == p.Name {
			l.pod = &p
			return nil
		}
	}
	return fmt.Errorf("look up %s in pod: no such device", p.Name)
}

func (f *fakeHost) EnableForwarding(bool) error {
	if err := f.fail("EnableForwarding"); err != nil {
		return err
	}
	f.forwarding = true
	return nil
}

// fakeNS stands for a pod namespace path; nothing enters it.
type fakeNS string

func (n fakeNS) Do(fn func(ns.NetNS) error) error { return fn(n) }
func (n fakeNS) Set() error                       { return errors.New("fake netns") }
func (n fakeNS) Path() string                     { return string(n) }
func (n fakeNS) Fd() uintptr                      { return ^uintptr(0) }
func (n fakeNS) Close() error                     { return nil }

// fakeEnv is a plugin on a fake host with a real IPAM store in a temp dir.
type fakeEnv struct {
	t    *testing.T
	host *fakeHost
	p    *plugin
	conf *Config
}

func newFakeEnv(t *testing.T, subnet string) *fakeEnv {
	dir := t.TempDir()
	boot := filepath.Join(dir, "boot_id")
	if err := os.WriteFile(boot, []byte("b1"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, err := ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"podnet","type":"podnet","subnet":"` + subnet +
		`","mtu":1400,"dataDir":"` + dir + `/ipam","bootIDFile":"` + boot + `"}`))
	if err != nil {
		t.Fatal(err)
	}
	h := newFakeHost()
	return &fakeEnv{t: t, host: h, p: &plugin{host: h}, conf: c}
}

var discard = slog.New(slog.NewTextHandler(io.Discard, nil))

func (e *fakeEnv) add(cid string) (netip.Addr, error) {
	res, err := e.p.add(e.conf, &skel.CmdArgs{ContainerID: cid, IfName: "eth0", Netns: "/run/netns/" + cid}, discard)
	if err != nil {
		return netip.Addr{}, err
	}
	return podAddr(e.t, res), nil
}

func (e *fakeEnv) allocations() []ipam.Allocation {
	txn, err := ipam.Open(e.conf.ipamOptions())
	if err != nil {
		e.t.Fatal(err)
	}
	defer txn.Close()
	return txn.Allocations()
}

func TestFakeAddSetsUpBridgeVethAndPod(t *testing.T) {
	e := newFakeEnv(t, "10.7.0.0/24")
	addr, err := e.add("c1")
	if err != nil {
		t.Fatal(err)
	}
	br := e.host.links["cbr0"]
	if br == nil || !slices.Equal(br.addrs, []netip.Prefix{netip.MustParsePrefix("10.7.0.1/24")}) || br.mtu != 1400 ||
		br.mac.String() != "0a:58:0a:07:00:01" {
		t.Fatalf("bridge %+v", br)
	}
	v := e.host.links[link.HostVethName("c1", "eth0")]
	if v == nil || v.master != br.index || v.mtu != 1400 || v.pod == nil ||
		len(v.pod.Addrs) != 1 || v.pod.Addrs[0] != (link.PodAddr{Addr: netip.PrefixFrom(addr, 24), Gateway: netip.MustParseAddr("10.7.0.1")}) {
		t.Fatalf("veth %+v", v)
	}
	if !e.host.forwarding {
		t.Error("forwarding not enabled")
	}
}

// Every step after the address is taken undoes everything when it fails.
func TestFakeAddRollsBackAtEveryStep(t *testing.T) {
	for _, step := range []string{"OpenNetNS", "Bridge", "SetMTU", "Addrs", "AddAddr", "SetMAC", "AddVeth", "ConfigurePod", "EnableForwarding"} {
		t.Run(step, func(t *testing.T) {
			e := newFakeEnv(t, "10.7.0.0/24")
			e.host.failOn = step
			_, err := e.add("c1")
			if err == nil || !strings.Contains(err.Error(), errInjected.Error()) {
				t.Fatalf("ADD with %s failing: %v", step, err)
			}
			if al := e.allocations(); len(al) != 0 {
				t.Errorf("allocations %v left after the failure", al)
			}
			if _, ok := e.host.links[link.HostVethName("c1", "eth0")]; ok {
				t.Error("host veth left after the failure")
			}
			// The next ADD works and does not skip an address for nothing
			// more than round-robin would.
			e.host.failOn = ""
			if _, err := e.add("c2"); err != nil {
				t.Errorf("ADD after the failure: %v", err)
			}
		})
	}
}

func TestFakeRepeatedAddThatFailsKeepsTheAddress(t *testing.T) {
	e := newFakeEnv(t, "10.7.0.0/24")
	first, err := e.add("c1")
	if err != nil {
		t.Fatal(err)
	}
	e.host.failOn = "ConfigurePod"
	if _, err := e.add("c1"); err == nil {
		t.Fatal("ADD succeeded with ConfigurePod failing")
	}
	// The address belonged to the attachment before this ADD: the
	// runtime's DEL releases it, not the rollback.
	if al := e.allocations(); len(al) != 1 || al[0].Addr != first {
		t.Errorf("allocations %v, want %s kept", al, first)
	}
}

func TestFakeStaleBridgeAddress(t *testing.T) {
	e := newFakeEnv(t, "10.7.0.0/24")
	if _, err := e.add("old"); err != nil {
		t.Fatal(err)
	}
	// The podCIDR moves: the old pod still holds 10.7.0.x.
	e.conf.Subnets = []netip.Prefix{netip.MustParsePrefix("10.8.0.0/24")}
	_, err := e.add("new")
	var te *types.Error
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater || !strings.Contains(te.Msg, "10.7.0.1/24") || !strings.Contains(te.Msg, "old/eth0") {
		t.Fatalf("ADD while a pod holds the old range: %v", err)
	}
	if got := e.host.links["cbr0"].addrs; !slices.Equal(got, []netip.Prefix{netip.MustParsePrefix("10.7.0.1/24")}) {
		t.Errorf("bridge addresses changed to %v while the old range is in use", got)
	}
	if err := e.p.del(e.conf, &skel.CmdArgs{ContainerID: "old", IfName: "eth0"}, discard); err != nil {
		t.Fatal(err)
	}
	if _, err := e.add("new"); err != nil {
		t.Fatalf("ADD after the old pod left: %v", err)
	}
	br := e.host.links["cbr0"]
	if !slices.Equal(br.addrs, []netip.Prefix{netip.MustParsePrefix("10.8.0.1/24")}) || br.mac.String() != "0a:58:0a:08:00:01" {
		t.Errorf("bridge %v %s, want only 10.8.0.1/24 and its MAC", br.addrs, br.mac)
	}
}

func TestFakeGCReportsErrorsAndGoesOn(t *testing.T) {
	e := newFakeEnv(t, "10.7.0.0/24")
	for _, c := range []string{"a", "b", "c"} {
		if _, err := e.add(c); err != nil {
			t.Fatal(err)
		}
	}
	e.conf.ValidAttachments = []types.GCAttachment{{ContainerID: "b", IfName: "eth0"}}
	e.conf.hasValidAttachments = true
	e.host.failOn = "HostVeths"
	err := e.p.gc(e.conf, discard)
	if !errors.Is(err, errInjected) {
		t.Fatalf("GC with listing failing: %v", err)
	}
	if al := e.allocations(); len(al) != 1 || al[0].ContainerID != "b" {
		t.Errorf("allocations after GC %v, want only b despite the listing error", al)
	}
	e.host.failOn = ""
	if err := e.p.gc(e.conf, discard); err != nil {
		t.Fatal(err)
	}
	names, _ := e.host.HostVeths()
	if len(names) != 1 || names[0] != link.HostVethName("b", "eth0") {
		t.Errorf("veths after GC %v, want only b's", names)
	}
}
