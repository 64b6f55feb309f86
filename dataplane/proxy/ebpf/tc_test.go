package ebpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/roottest"
)

// Program.Run tests of the tc programs on crafted packets.

type pkt struct {
	src, dst   netip.AddrPort
	proto      uint8
	zeroUDPSum bool
}

func csumFold(sum uint32) uint16 {
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func csumAdd(sum uint32, b []byte) uint32 {
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint32(binary.BigEndian.Uint16(b[i:]))
	}
	if len(b)%2 == 1 {
		sum += uint32(b[len(b)-1]) << 8
	}
	return sum
}

// bytes builds Ethernet + IPv4 or IPv6 (by the addresses' family) + TCP
// (SYN) or UDP with a payload and valid checksums.
func (p pkt) bytes() []byte {
	payload := []byte("hello")
	l4len := 20
	if p.proto == 17 {
		l4len = 8
	}
	iplen := 20
	if p.v6() {
		iplen = 40
	}
	b := make([]byte, 14+iplen+l4len+len(payload))
	ip := b[14 : 14+iplen]
	if p.v6() {
		binary.BigEndian.PutUint16(b[12:], 0x86dd)
		ip[0] = 0x60
		binary.BigEndian.PutUint16(ip[4:], uint16(l4len+len(payload)))
		ip[6] = p.proto
		ip[7] = 64
		s16, d16 := p.src.Addr().As16(), p.dst.Addr().As16()
		copy(ip[8:], s16[:])
		copy(ip[24:], d16[:])
	} else {
		binary.BigEndian.PutUint16(b[12:], 0x0800)
		ip[0] = 0x45
		binary.BigEndian.PutUint16(ip[2:], uint16(20+l4len+len(payload)))
		ip[8] = 64
		ip[9] = p.proto
		s4, d4 := p.src.Addr().As4(), p.dst.Addr().As4()
		copy(ip[12:], s4[:])
		copy(ip[16:], d4[:])
		binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
	}
	l4 := b[14+iplen:]
	binary.BigEndian.PutUint16(l4[0:], p.src.Port())
	binary.BigEndian.PutUint16(l4[2:], p.dst.Port())
	if p.proto == 6 {
		l4[12] = 5 << 4
		l4[13] = 0x02 // SYN
		binary.BigEndian.PutUint16(l4[14:], 65535)
	} else {
		binary.BigEndian.PutUint16(l4[4:], uint16(l4len+len(payload)))
	}
	copy(l4[l4len:], payload)
	if p.proto == 17 && p.zeroUDPSum {
		return b
	}
	binary.BigEndian.PutUint16(l4[l4csum(p.proto):], l4sum(b))
	return b
}

func (p pkt) v6() bool { return p.src.Addr().Is6() }

func l4csum(proto uint8) int {
	if proto == 6 {
		return 16
	}
	return 6
}

// ipLayer splits packet b into its IP header and the rest, by its
// EtherType.
func ipLayer(b []byte) (ip, l4 []byte, v6 bool) {
	if binary.BigEndian.Uint16(b[12:]) == 0x86dd {
		return b[14:54], b[54:], true
	}
	return b[14:34], b[34:], false
}

// l4sum is the L4 checksum of packet b with its checksum field as it is
// (0 when computing, the stored value when verifying gives 0), over the
// family's pseudo-header.
func l4sum(b []byte) uint16 {
	ip, l4, v6 := ipLayer(b)
	if v6 {
		var ph [40]byte
		copy(ph[0:], ip[8:40])
		binary.BigEndian.PutUint32(ph[32:], uint32(len(l4)))
		ph[39] = ip[6]
		return csumFold(csumAdd(csumAdd(0, ph[:]), l4))
	}
	var ph [12]byte
	copy(ph[0:], ip[12:20])
	ph[9] = ip[9]
	binary.BigEndian.PutUint16(ph[10:], uint16(len(l4)))
	return csumFold(csumAdd(csumAdd(0, ph[:]), l4))
}

// parsePkt reads back addresses and checks the checksums.
func parsePkt(t *testing.T, b []byte) pkt {
	t.Helper()
	ip, l4, v6 := ipLayer(b)
	var p pkt
	if v6 {
		p = pkt{
			src:   netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[8:24])), binary.BigEndian.Uint16(l4[0:])),
			dst:   netip.AddrPortFrom(netip.AddrFrom16([16]byte(ip[24:40])), binary.BigEndian.Uint16(l4[2:])),
			proto: ip[6],
		}
	} else {
		if s := csumFold(csumAdd(0, ip)); s != 0 {
			t.Errorf("bad IP checksum (residue %#x)", s)
		}
		p = pkt{
			src:   netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(l4[0:])),
			dst:   netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(l4[2:])),
			proto: ip[9],
		}
	}
	if p.proto == 17 && binary.BigEndian.Uint16(l4[6:]) == 0 {
		p.zeroUDPSum = true
		return p
	}
	if s := l4sum(b); s != 0 && !(p.proto == 17 && s == 0xffff) {
		t.Errorf("bad L4 checksum (residue %#x)", s)
	}
	return p
}

type tcEnv struct {
	t  *testing.T
	dp *Datapath
	sy *Syncer
}

const nodeIP = "192.168.10.11"

// nodeIP2 is the node's second address: NodePorts answer there too, and
// SNAT to it (the SNAT address, nodeIP, is for externalIPs and LB IPs).
const nodeIP2 = "192.168.10.12"

// The node's IPv6 addresses, the first the family's SNAT address.
const (
	nodeIP6  = "fd00:10::11"
	nodeIP62 = "fd00:10::12"
)

func newTCEnv(t *testing.T, ports map[cluster.Key][]*proxy.ServicePort) *tcEnv {
	t.Helper()
	roottest.Require(t)
	dp, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	sy := NewSyncer(dp.Maps, func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP6),
			netip.MustParseAddr(nodeIP2), netip.MustParseAddr(nodeIP62)}, nil
	})
	if _, err := sy.Sync(ports, nil, true); err != nil {
		t.Fatal(err)
	}
	return &tcEnv{t: t, dp: dp, sy: sy}
}

const (
	tcOK       = 0
	tcShot     = 2
	tcRedirect = 7
)

// run passes p through prog and returns the verdict and the packet after.
func (e *tcEnv) run(t *testing.T, prog string, p pkt) (int, pkt) {
	t.Helper()
	in := p.bytes()
	out := make([]byte, len(in)+64)
	ret, err := e.dp.np.Programs[prog].Run(&ebpf.RunOptions{Data: in, DataOut: out})
	if err != nil {
		t.Fatal(err)
	}
	return int(int32(ret)), parsePkt(t, out[:len(in)])
}

// tcFamily holds one family's addresses for the tc tests; a dual-stack
// node holds both families' Services at once.
type tcFamily struct {
	name                string
	node, node2         string // the node's addresses, node the SNAT one
	client, inRange     string // a client outside, one inside the LB's source range
	local, remote       string // the endpoints: on this node, on another
	vip                 string // the cluster IPs' prefix
	lbIP, extIP, ranges string
}

var tcFamilies = []tcFamily{
	{name: "IPv4", node: nodeIP, node2: nodeIP2, client: "203.0.113.7", inRange: "10.1.2.3",
		local: "10.244.1.5", remote: "10.244.2.5", vip: "10.96.0.", lbIP: "192.0.2.60", extIP: "192.0.2.50", ranges: "10.0.0.0/8"},
	{name: "IPv6", node: nodeIP6, node2: nodeIP62, client: "2001:db8:7::7", inRange: "fd00:1::3",
		local: "fd00:244:1::5", remote: "fd00:244:2::5", vip: "fd00:96::", lbIP: "2001:db8::60", extIP: "2001:db8::50", ranges: "fd00:1::/48"},
}

// at is addr:port in f's family.
func at(addr string, port uint16) netip.AddrPort {
	return netip.AddrPortFrom(netip.MustParseAddr(addr), port)
}

// tcServicePorts are f's ports of the tc tests' Services, by name.
func (f tcFamily) servicePorts() map[string]*proxy.ServicePort {
	local, remote := ep(f.local, 8080, true), ep(f.remote, 8080, false)
	np := clusterIPPort("np", f.vip+"20", 80, cluster.TCP, local, remote)
	np.NodePort = 30080
	np.LocalEndpoints = []proxy.Endpoint{local}
	loc := clusterIPPort("local", f.vip+"21", 80, cluster.TCP, local, remote)
	loc.NodePort = 30081
	loc.ExternalPolicyLocal = true
	loc.LocalEndpoints = []proxy.Endpoint{local}
	lb := clusterIPPort("lb", f.vip+"22", 80, cluster.TCP, remote)
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr(f.lbIP)}
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix(f.ranges)}
	ext := clusterIPPort("ext", f.vip+"23", 53, cluster.UDP, remote)
	ext.ExternalIPs = []netip.Addr{netip.MustParseAddr(f.extIP)}
	empty := clusterIPPort("empty", f.vip+"24", 80, cluster.TCP)
	empty.NodePort = 30082
	emptyUDP := clusterIPPort("emptyudp", f.vip+"25", 53, cluster.UDP)
	emptyUDP.NodePort = 30083
	return map[string]*proxy.ServicePort{"np": np, "local": loc, "lb": lb, "ext": ext, "empty": empty, "emptyudp": emptyUDP}
}

// tcServices are the tc tests' Services, dual-stack: one port per family
// each, the same NodePorts in both.
func tcServices() map[cluster.Key][]*proxy.ServicePort {
	out := map[cluster.Key][]*proxy.ServicePort{}
	for _, f := range tcFamilies {
		for name, sp := range f.servicePorts() {
			out[key(name)] = append(out[key(name)], sp)
		}
	}
	return out
}

func TestTCNodePort(t *testing.T) {
	e := newTCEnv(t, tcServices())
	for _, f := range tcFamilies {
		t.Run(f.name, func(t *testing.T) { e.checkNodePort(t, f) })
	}
}

// checkNodePort runs TestTCNodePort's cases in family f.
func (e *tcEnv) checkNodePort(t *testing.T, f tcFamily) {
	client := at(f.client, 40000)
	backends := map[netip.AddrPort]bool{at(f.local, 8080): true, at(f.remote, 8080): true}

	// DNAT to a backend, SNAT to the node address the client used.
	syn := pkt{src: client, dst: at(f.node, 30080), proto: 6}
	ret, out := e.run(t, TCNodePort, syn)
	if ret != tcOK && ret != tcRedirect {
		t.Fatalf("NodePort SYN: verdict %d", ret)
	}
	if !backends[out.dst] || out.src.Addr() != netip.MustParseAddr(f.node) {
		t.Fatalf("NodePort SYN left as %v -> %v; want DNAT to a backend and SNAT to %s", out.src, out.dst, f.node)
	}
	// At the node's other address: SNAT to that one, not the SNAT address.
	if _, out2 := e.run(t, TCNodePort, pkt{src: client, dst: at(f.node2, 30080), proto: 6}); !backends[out2.dst] || out2.src.Addr() != netip.MustParseAddr(f.node2) {
		t.Errorf("NodePort SYN to %s left as %v -> %v; want SNAT to %s", f.node2, out2.src, out2.dst, f.node2)
	}
	// The flow's next packet meets the conntrack entry: same backend, same
	// source port.
	for range 5 {
		if _, again := e.run(t, TCNodePort, syn); again != out {
			t.Fatalf("second packet of the flow went %v -> %v, first %v -> %v", again.src, again.dst, out.src, out.dst)
		}
	}
	// The reply is translated back: from the NodePort to the client. From
	// a local pod the reply arrives on the bridge, where the same program
	// translates it alike.
	for range 2 {
		ret, back := e.run(t, TCNodePort, pkt{src: out.dst, dst: out.src, proto: 6})
		if ret != tcOK && ret != tcRedirect {
			t.Fatalf("reply: verdict %d", ret)
		}
		if back.src != syn.dst || back.dst != client {
			t.Errorf("reply left as %v -> %v, want %v -> %v", back.src, back.dst, syn.dst, client)
		}
	}

	t.Run("policy Local keeps the client address and uses the local endpoint", func(t *testing.T) {
		for port := uint16(41000); port < 41010; port++ {
			c := at(f.client, port)
			_, out := e.run(t, TCNodePort, pkt{src: c, dst: at(f.node, 30081), proto: 6})
			if out.src != c || out.dst != at(f.local, 8080) {
				t.Fatalf("policy Local: %v -> %v", out.src, out.dst)
			}
			_, back := e.run(t, TCNodePort, pkt{src: out.dst, dst: c, proto: 6})
			if back.src != at(f.node, 30081) || back.dst != c {
				t.Fatalf("policy Local reply: %v -> %v", back.src, back.dst)
			}
		}
	})
	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		if ret, _ := e.run(t, TCNodePort, pkt{src: client, dst: at(f.lbIP, 80), proto: 6}); ret != tcShot {
			t.Errorf("client outside the ranges: verdict %d, want drop", ret)
		}
		ret, out := e.run(t, TCNodePort, pkt{src: at(f.inRange, 5555), dst: at(f.lbIP, 80), proto: 6})
		if ret == tcShot || out.dst != at(f.remote, 8080) || out.src.Addr() != netip.MustParseAddr(f.node) {
			t.Errorf("client inside the ranges: verdict %d, %v -> %v", ret, out.src, out.dst)
		}
	})
	t.Run("UDP to an external IP, SNAT to the family's address", func(t *testing.T) {
		zeros := []bool{false, true}
		if f.name == "IPv6" {
			zeros = zeros[:1] // IPv6 UDP always has a checksum
		}
		for _, zero := range zeros {
			_, out := e.run(t, TCNodePort, pkt{src: client, dst: at(f.extIP, 53), proto: 17, zeroUDPSum: zero})
			if out.dst != at(f.remote, 8080) || out.src.Addr() != netip.MustParseAddr(f.node) || out.zeroUDPSum != zero {
				t.Errorf("UDP (zero checksum %v): %v -> %v, zero after: %v", zero, out.src, out.dst, out.zeroUDPSum)
			}
		}
	})
	t.Run("the UDP flow expires when its endpoint leaves", func(t *testing.T) {
		ft := FlowTarget{Frontend: at(f.extIP, 53), Backend: at(f.remote, 8080)}
		flows, _, err := e.dp.Flows().Expire([]FlowTarget{ft})
		if err != nil || flows != 1 {
			t.Errorf("expired %d flows (%v), want the one", flows, err)
		}
		left := 0
		if err := e.dp.Flows().Fwd.Each(func(k bpf.NodeportCtKey, v bpf.NodeportCtFwdVal) {
			if ft.matches(k, netip.AddrPortFrom(addrFrom16(v.Baddr), be16(v.Bport))) {
				left++
			}
		}); err != nil || left != 0 {
			t.Errorf("%d flows to %v left (%v)", left, ft, err)
		}
	})
	t.Run("no endpoints: ICMP port unreachable; not a Service: passed untouched", func(t *testing.T) {
		e.checkUnreachable(t, pkt{src: client, dst: at(f.node, 30082), proto: 6})
		e.checkUnreachable(t, pkt{src: client, dst: at(f.node, 30083), proto: 17})
		p := pkt{src: client, dst: at(f.node, 22), proto: 6}
		if ret, out := e.run(t, TCNodePort, p); ret != -1 || out != p {
			t.Errorf("not a Service: verdict %d, %v -> %v", ret, out.src, out.dst)
		}
	})
}

// Every node picks the same backend for a flow, in each family: two
// datapaths loaded separately (two nodes) agree on each of many flows, and
// the flows spread over both backends.
func TestTCConsistentPick(t *testing.T) {
	// Node b knows another Service first: its ids differ from a's.
	other := tcServices()
	for _, f := range tcFamilies {
		sp := clusterIPPort("aaa", f.vip+"99", 80, cluster.TCP, ep(f.nth(9, 9), 80, false))
		sp.NodePort = 30099
		other[key("aaa")] = append(other[key("aaa")], sp)
	}
	a, b := newTCEnv(t, tcServices()), newTCEnv(t, other)
	for _, f := range tcFamilies {
		t.Run(f.name, func(t *testing.T) {
			seen := map[netip.AddrPort]int{}
			for port := uint16(20000); port < 20100; port++ {
				p := pkt{src: at(f.client, port), dst: at(f.node, 30080), proto: 6}
				_, oa := a.run(t, TCNodePort, p)
				_, ob := b.run(t, TCNodePort, p)
				if oa.dst != ob.dst {
					t.Fatalf("flow from port %d: node a picked %v, node b %v", port, oa.dst, ob.dst)
				}
				seen[oa.dst]++
			}
			if len(seen) != 2 || seen[at(f.local, 8080)] < 25 {
				t.Errorf("100 flows went %v; want both backends used", seen)
			}
		})
	}
}

// nth is the address of f's pod network node i, host j.
func (f tcFamily) nth(i, j int) string {
	if f.name == "IPv6" {
		return fmt.Sprintf("fd00:244:%d::%d", i, j)
	}
	return fmt.Sprintf("10.244.%d.%d", i, j)
}

// Maglev, in each family: with one of ten endpoints gone, flows to the
// other nine keep their backend (compared between two nodes, one with the
// endpoint, one without; the Service is dual-stack, the endpoint goes in
// the family under test).
func TestTCMaglevFewFlowsMove(t *testing.T) {
	eps := map[string][]proxy.Endpoint{}
	for _, f := range tcFamilies {
		for i := range 10 {
			eps[f.name] = append(eps[f.name], ep(f.nth(i%3, 10+i), 8080, false))
		}
	}
	svcs := func(without string) map[cluster.Key][]*proxy.ServicePort {
		var sps []*proxy.ServicePort
		for _, f := range tcFamilies {
			mine := eps[f.name]
			if f.name == without {
				mine = append(mine[:4:4], mine[5:]...)
			}
			sp := clusterIPPort("big", f.vip+"30", 80, cluster.TCP, mine...)
			sp.NodePort = 30030
			sps = append(sps, sp)
		}
		return map[cluster.Key][]*proxy.ServicePort{key("big"): sps}
	}
	all := newTCEnv(t, svcs(""))
	for _, f := range tcFamilies {
		t.Run(f.name, func(t *testing.T) {
			less := newTCEnv(t, svcs(f.name))
			gone := eps[f.name][4].AddrPort()
			var kept, stayed int
			seen := map[netip.AddrPort]bool{}
			for port := uint16(30000); port < 30400; port++ {
				p := pkt{src: at(f.client, port), dst: at(f.node, 30030), proto: 6}
				_, before := all.run(t, TCNodePort, p)
				_, after := less.run(t, TCNodePort, p)
				seen[before.dst] = true
				if before.dst == gone {
					continue
				}
				kept++
				if after.dst == before.dst {
					stayed++
				}
			}
			if len(seen) != 10 {
				t.Errorf("400 flows reached %d of 10 backends", len(seen))
			}
			if stayed < kept*9/10 {
				t.Errorf("of %d flows not on the removed backend, %d kept theirs; want ≥ 90%%", kept, stayed)
			}
		})
	}
}

// checkUnreachable runs p and checks the answer is an ICMP port
// unreachable (ICMPv6 for IPv6) to its source, from the address it was
// sent to, quoting its IP header and first 8 bytes, with the checksums
// right, sent back out of the interface p came in on.
func (e *tcEnv) checkUnreachable(t *testing.T, p pkt) {
	t.Helper()
	in := p.bytes()
	copy(in[0:6], []byte{2, 0, 0, 0, 0, 1})  // to the node
	copy(in[6:12], []byte{2, 0, 0, 0, 0, 2}) // from the client
	out := make([]byte, 256)
	opts := &ebpf.RunOptions{Data: in, DataOut: out}
	ret, err := e.dp.np.Programs[TCNodePort].Run(opts)
	if err != nil {
		t.Fatal(err)
	}
	out = opts.DataOut
	iplen, icmpType, icmpCode, icmpProto := 20, uint8(3), uint8(3), uint8(1)
	if p.v6() {
		iplen, icmpType, icmpCode, icmpProto = 40, 1, 4, 58
	}
	if want := 14 + iplen + 8 + iplen + 8; ret != tcRedirect || len(out) != want {
		t.Fatalf("%v: verdict %d, %d bytes; want a %d-byte reply redirected", p.dst, ret, len(out), want)
	}
	if string(out[0:6]) != string(in[6:12]) || string(out[6:12]) != string(in[0:6]) {
		t.Errorf("MACs not swapped: % x", out[:12])
	}
	ip, icmp, _ := ipLayer(out)
	var src, dst netip.Addr
	var proto uint8
	sum := csumAdd(0, icmp)
	if p.v6() {
		src, dst, proto = netip.AddrFrom16([16]byte(ip[8:24])), netip.AddrFrom16([16]byte(ip[24:40])), ip[6]
		if pl := binary.BigEndian.Uint16(ip[4:]); int(pl) != len(icmp) || ip[0]>>4 != 6 {
			t.Errorf("IPv6 header: version %d, payload length %d, want 6, %d", ip[0]>>4, pl, len(icmp))
		}
		var ph [40]byte
		copy(ph[0:], ip[8:40])
		binary.BigEndian.PutUint32(ph[32:], uint32(len(icmp)))
		ph[39] = 58
		sum = csumAdd(sum, ph[:])
	} else {
		src, dst, proto = netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20])), ip[9]
		if s := csumFold(csumAdd(0, ip)); s != 0 {
			t.Errorf("bad IP checksum")
		}
	}
	if s := csumFold(sum); s != 0 {
		t.Errorf("bad ICMP checksum")
	}
	if proto != icmpProto || icmp[0] != icmpType || icmp[1] != icmpCode || src != p.dst.Addr() || dst != p.src.Addr() {
		t.Errorf("%v: reply proto %d type %d code %d %v -> %v; want %d %d/%d %v -> %v", p.dst, proto, icmp[0], icmp[1], src, dst,
			icmpProto, icmpType, icmpCode, p.dst.Addr(), p.src.Addr())
	}
	if q := in[14 : 14+iplen+8]; string(icmp[8:]) != string(q) {
		t.Errorf("quote % x, want the original IP header and 8 bytes % x", icmp[8:], q)
	}
}
