package routing

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/cluster"
)

// scalePeers are n nodes on 192.168.0.0/16 (node1 is 192.168.0.11), the
// i-th with podCIDR 10.128.0.0/10's i-th /24.
func scalePeers(n int) []*cluster.Node {
	nodes := make([]*cluster.Node, n)
	for i := range nodes {
		ip := netip.AddrFrom4([4]byte{192, 168, byte((11 + i) >> 8), byte(11 + i)})
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(128 + i>>8), byte(i), 0}), 24)
		nodes[i] = &cluster.Node{Name: fmt.Sprintf("node%05d", i+1), InternalIPs: []netip.Addr{ip}, PodCIDRs: []netip.Prefix{cidr}}
	}
	return nodes
}

func scaleConfig(b Backend) Config {
	return Config{
		NodeName: "node00001", Backend: b, NodeIP: netip.MustParseAddr("192.168.0.11"),
		NodeSubnet: netip.MustParsePrefix("192.168.0.0/16"), Iface: "eth0", UnderlayMTU: 1500,
		Device: DefaultDevice, VNI: DefaultVNI, Port: DefaultPort,
	}
}

// BenchmarkApplyAtScale programs the routes (and with VXLAN the neighbour
// and FDB entries) to 4,999 peers into a namespace of its own. "first
// program" times, in one namespace and turn about so that the box's load
// falls on each alike, three ways of filling an empty node: the agent's
// (a Table made from the Nodes, its plan Applied; "program-ms", the VXLAN
// device created too), the same with Watch running and each event matched
// against the table, as in proxyd ("watched-ms"), and the same kernel
// objects added by one plain library call each with no reconciler
// ("bare-ms", the device already there: the floor of one request per
// object). "resync" is a full Apply that finds nothing to change, "one
// node" a Table change adding one Node and one removing it again, each
// Patched in.
func BenchmarkApplyAtScale(b *testing.B) {
	const n = 5000
	nodes := scalePeers(n)
	for _, backend := range []Backend{BackendHostGW, BackendVXLAN} {
		cfg := scaleConfig(backend)
		plan := Compute(cfg, nodes)
		b.Run(string(backend)+"/first program", func(b *testing.B) {
			_, h, nsh := newTestNSWith(b, "192.168.0.11/16")
			r := &Reconciler{Kernel: newTestKernel(b, nsh), Device: DefaultDevice}
			program := func() time.Duration {
				if _, err := r.Apply(Plan{}); err != nil {
					b.Fatal(err)
				}
				start := time.Now()
				if _, err := r.Apply(NewTable(cfg, nodes).Plan()); err != nil {
					b.Fatal(err)
				}
				return time.Since(start)
			}
			watched := func() time.Duration {
				if _, err := r.Apply(Plan{}); err != nil {
					b.Fatal(err)
				}
				var t atomic.Pointer[Table]
				var foreign atomic.Int64
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan error, 1)
				live := make(chan struct{})
				go func() {
					done <- Watch(ctx, nsh, DefaultDevice, func(e Event) {
						if tab := t.Load(); tab == nil || !tab.Matches(e) {
							foreign.Add(1)
						}
					}, func() { close(live) })
				}()
				<-live
				start := time.Now()
				tab := NewTable(cfg, nodes)
				t.Store(tab)
				if _, err := r.Apply(tab.Plan()); err != nil {
					b.Fatal(err)
				}
				took := time.Since(start)
				time.Sleep(200 * time.Millisecond) // the last echoes
				cancel()
				<-done
				if f := foreign.Load(); f > 0 {
					b.Errorf("%d of the program's own events taken for foreign ones", f)
				}
				return took
			}
			bare := func() time.Duration {
				if _, err := r.Apply(Plan{Device: plan.Device}); err != nil {
					b.Fatal(err)
				}
				eth0, _ := h.LinkByName("eth0")
				idx := eth0.Attrs().Index
				if plan.Device != nil {
					dev, _ := h.LinkByName(DefaultDevice)
					idx = dev.Attrs().Index
				}
				start := time.Now()
				bareAdd(b, h, plan, idx)
				return time.Since(start)
			}
			ways := []func() time.Duration{program, watched, bare}
			took := make([]time.Duration, len(ways))
			i := 0
			for b.Loop() {
				for j := range ways {
					w := (i + j) % len(ways)
					took[w] += ways[w]()
				}
				i++
			}
			for w, unit := range []string{"program-ms", "watched-ms", "bare-ms"} {
				b.ReportMetric(float64(took[w].Milliseconds())/float64(i), unit)
			}
		})
		b.Run(string(backend)+"/resync", func(b *testing.B) {
			_, _, nsh := newTestNSWith(b, "192.168.0.11/16")
			r := &Reconciler{Kernel: newTestKernel(b, nsh), Device: DefaultDevice}
			if _, err := r.Apply(plan); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if c, err := r.Apply(Compute(cfg, nodes)); err != nil || len(c) != 0 {
					b.Fatal(c, err)
				}
			}
		})
		b.Run(string(backend)+"/one node", func(b *testing.B) {
			_, _, nsh := newTestNSWith(b, "192.168.0.11/16")
			r := &Reconciler{Kernel: newTestKernel(b, nsh), Device: DefaultDevice}
			t := NewTable(cfg, nodes)
			if _, err := r.Apply(t.Plan()); err != nil {
				b.Fatal(err)
			}
			extra := scalePeers(n + 1)[n]
			for b.Loop() {
				for _, d := range []func() Delta{func() Delta { return t.Set(extra) }, func() Delta { return t.Delete(extra.Name) }} {
					if c, err := r.Patch(d()); err != nil || len(c) == 0 {
						b.Fatal(c, err)
					}
				}
			}
		})
	}
}

// bareAdd adds plan's FDB, neighbour and route entries with one netlink
// call each and nothing else.
func bareAdd(b *testing.B, h *netlink.Handle, plan Plan, idx int) {
	for _, f := range plan.FDB {
		if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: unix.AF_BRIDGE, State: netlink.NUD_PERMANENT,
			Flags: netlink.NTF_SELF, IP: f.Dst.AsSlice(), HardwareAddr: f.MAC}); err != nil {
			b.Fatal(err)
		}
	}
	for _, n := range plan.Neighs {
		if err := h.NeighSet(&netlink.Neigh{LinkIndex: idx, Family: netlink.FAMILY_V4, State: netlink.NUD_PERMANENT,
			IP: n.IP.AsSlice(), HardwareAddr: n.MAC}); err != nil {
			b.Fatal(err)
		}
	}
	for _, r := range plan.Routes {
		nr := &netlink.Route{LinkIndex: idx, Dst: &net.IPNet{IP: r.Dst.Addr().AsSlice(), Mask: net.CIDRMask(r.Dst.Bits(), 32)},
			Gw: r.Gw.AsSlice(), Protocol: Protocol, Table: unix.RT_TABLE_MAIN}
		if r.Onlink {
			nr.Flags = int(netlink.FLAG_ONLINK)
		}
		if err := h.RouteReplace(nr); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNodeChange is the Go side of one Node added and removed
// among 5,000 (the table updated, its delta written), on the fake kernel.
func BenchmarkNodeChange(b *testing.B) {
	const n = 5000
	nodes := scalePeers(n)
	extra := scalePeers(n + 1)[n]
	for _, backend := range []Backend{BackendHostGW, BackendVXLAN} {
		cfg := scaleConfig(backend)
		b.Run(string(backend), func(b *testing.B) {
			k := NewFakeKernel(map[string]netip.Prefix{"eth0": cfg.NodeSubnet})
			r := &Reconciler{Kernel: k, Device: DefaultDevice}
			t := NewTable(cfg, nodes)
			if _, err := r.Apply(t.Plan()); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				for _, d := range []func() Delta{func() Delta { return t.Set(extra) }, func() Delta { return t.Delete(extra.Name) }} {
					if c, err := r.Patch(d()); err != nil || len(c) == 0 {
						b.Fatal(c, err)
					}
				}
			}
		})
	}
}
