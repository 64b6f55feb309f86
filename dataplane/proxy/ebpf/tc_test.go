package ebpf

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"

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

// bytes builds Ethernet + IPv4 + TCP (SYN) or UDP with a payload and valid
// checksums.
func (p pkt) bytes() []byte {
	payload := []byte("hello")
	l4len := 20
	if p.proto == 17 {
		l4len = 8
	}
	b := make([]byte, 14+20+l4len+len(payload))
	binary.BigEndian.PutUint16(b[12:], 0x0800)
	ip := b[14:34]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(20+l4len+len(payload)))
	ip[8] = 64
	ip[9] = p.proto
	s4, d4 := p.src.Addr().As4(), p.dst.Addr().As4()
	copy(ip[12:], s4[:])
	copy(ip[16:], d4[:])
	binary.BigEndian.PutUint16(ip[10:], csumFold(csumAdd(0, ip)))
	l4 := b[34:]
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

func l4csum(proto uint8) int {
	if proto == 6 {
		return 16
	}
	return 6
}

// l4sum is the L4 checksum of packet b with its checksum field as it is
// (0 when computing, the stored value when verifying gives 0).
func l4sum(b []byte) uint16 {
	ip, l4 := b[14:34], b[34:]
	var ph [12]byte
	copy(ph[0:], ip[12:20])
	ph[9] = ip[9]
	binary.BigEndian.PutUint16(ph[10:], uint16(len(l4)))
	return csumFold(csumAdd(csumAdd(0, ph[:]), l4))
}

// parsePkt reads back addresses and checks both checksums.
func parsePkt(t *testing.T, b []byte) pkt {
	t.Helper()
	ip, l4 := b[14:34], b[34:]
	if s := csumFold(csumAdd(0, ip)); s != 0 {
		t.Errorf("bad IP checksum (residue %#x)", s)
	}
	p := pkt{
		src:   netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[12:16])), binary.BigEndian.Uint16(l4[0:])),
		dst:   netip.AddrPortFrom(netip.AddrFrom4([4]byte(ip[16:20])), binary.BigEndian.Uint16(l4[2:])),
		proto: ip[9],
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

func newTCEnv(t *testing.T, ports map[cluster.Key][]*proxy.ServicePort) *tcEnv {
	t.Helper()
	roottest.Require(t)
	dp, err := load("")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { dp.Close() })
	sy := NewSyncer(dp.Maps, func() ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr(nodeIP), netip.MustParseAddr(nodeIP2)}, nil
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
func (e *tcEnv) run(prog string, p pkt) (int, pkt) {
	e.t.Helper()
	in := p.bytes()
	out := make([]byte, len(in)+64)
	ret, err := e.dp.np.Programs[prog].Run(&ebpf.RunOptions{Data: in, DataOut: out})
	if err != nil {
		e.t.Fatal(err)
	}
	return int(int32(ret)), parsePkt(e.t, out[:len(in)])
}

func ap(s string) netip.AddrPort { return netip.MustParseAddrPort(s) }

func tcServices() map[cluster.Key][]*proxy.ServicePort {
	local, remote := ep("10.244.1.5", 8080, true), ep("10.244.2.5", 8080, false)
	np := clusterIPPort("np", "10.96.0.20", 80, cluster.TCP, local, remote)
	np.NodePort = 30080
	np.LocalEndpoints = []proxy.Endpoint{local}
	loc := clusterIPPort("local", "10.96.0.21", 80, cluster.TCP, local, remote)
	loc.NodePort = 30081
	loc.ExternalPolicyLocal = true
	loc.LocalEndpoints = []proxy.Endpoint{local}
	lb := clusterIPPort("lb", "10.96.0.22", 80, cluster.TCP, remote)
	lb.LoadBalancerIPs = []netip.Addr{netip.MustParseAddr("192.0.2.60")}
	lb.LoadBalancerSourceRanges = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	ext := clusterIPPort("ext", "10.96.0.23", 53, cluster.UDP, remote)
	ext.ExternalIPs = []netip.Addr{netip.MustParseAddr("192.0.2.50")}
	empty := clusterIPPort("empty", "10.96.0.24", 80, cluster.TCP)
	empty.NodePort = 30082
	emptyUDP := clusterIPPort("emptyudp", "10.96.0.25", 53, cluster.UDP)
	emptyUDP.NodePort = 30083
	return map[cluster.Key][]*proxy.ServicePort{
		key("np"): {np}, key("local"): {loc}, key("lb"): {lb}, key("ext"): {ext}, key("empty"): {empty}, key("emptyudp"): {emptyUDP},
	}
}

func TestTCNodePort(t *testing.T) {
	e := newTCEnv(t, tcServices())
	client := ap("203.0.113.7:40000")
	backends := map[netip.AddrPort]bool{ap("10.244.1.5:8080"): true, ap("10.244.2.5:8080"): true}

	// DNAT to a backend, SNAT to the node address the client used.
	syn := pkt{src: client, dst: ap(nodeIP + ":30080"), proto: 6}
	ret, out := e.run(TCNodePort, syn)
	if ret != tcOK && ret != tcRedirect {
		t.Fatalf("NodePort SYN: verdict %d", ret)
	}
	if !backends[out.dst] || out.src.Addr() != netip.MustParseAddr(nodeIP) {
		t.Fatalf("NodePort SYN left as %v -> %v; want DNAT to a backend and SNAT to %s", out.src, out.dst, nodeIP)
	}
	// At the node's other address: SNAT to that one, not the SNAT address.
	if _, out2 := e.run(TCNodePort, pkt{src: client, dst: ap(nodeIP2 + ":30080"), proto: 6}); !backends[out2.dst] || out2.src.Addr() != netip.MustParseAddr(nodeIP2) {
		t.Errorf("NodePort SYN to %s left as %v -> %v; want SNAT to %s", nodeIP2, out2.src, out2.dst, nodeIP2)
	}
	// The flow's next packet meets the conntrack entry: same backend, same
	// source port.
	for range 5 {
		if _, again := e.run(TCNodePort, syn); again != out {
			t.Fatalf("second packet of the flow went %v -> %v, first %v -> %v", again.src, again.dst, out.src, out.dst)
		}
	}
	// The reply is translated back: from the NodePort to the client.
	ret, back := e.run(TCNodePort, pkt{src: out.dst, dst: out.src, proto: 6})
	if ret != tcOK && ret != tcRedirect {
		t.Fatalf("reply: verdict %d", ret)
	}
	if back.src != syn.dst || back.dst != client {
		t.Errorf("reply left as %v -> %v, want %v -> %v", back.src, back.dst, syn.dst, client)
	}
	// From a local pod the reply arrives on the bridge, where the same
	// program translates it.
	if _, back := e.run(TCNodePort, pkt{src: out.dst, dst: out.src, proto: 6}); back.src != syn.dst || back.dst != client {
		t.Errorf("reply on the bridge left as %v -> %v", back.src, back.dst)
	}

	t.Run("policy Local keeps the client address and uses the local endpoint", func(t *testing.T) {
		for port := uint16(41000); port < 41010; port++ {
			c := netip.AddrPortFrom(client.Addr(), port)
			_, out := e.run(TCNodePort, pkt{src: c, dst: ap(nodeIP + ":30081"), proto: 6})
			if out.src != c || out.dst != ap("10.244.1.5:8080") {
				t.Fatalf("policy Local: %v -> %v", out.src, out.dst)
			}
			_, back := e.run(TCNodePort, pkt{src: out.dst, dst: c, proto: 6})
			if back.src != ap(nodeIP+":30081") || back.dst != c {
				t.Fatalf("policy Local reply: %v -> %v", back.src, back.dst)
			}
		}
	})
	t.Run("loadBalancerSourceRanges", func(t *testing.T) {
		if ret, _ := e.run(TCNodePort, pkt{src: client, dst: ap("192.0.2.60:80"), proto: 6}); ret != tcShot {
			t.Errorf("client outside the ranges: verdict %d, want drop", ret)
		}
		ret, out := e.run(TCNodePort, pkt{src: ap("10.1.2.3:5555"), dst: ap("192.0.2.60:80"), proto: 6})
		if ret == tcShot || out.dst != ap("10.244.2.5:8080") || out.src.Addr() != netip.MustParseAddr(nodeIP) {
			t.Errorf("client inside the ranges: verdict %d, %v -> %v", ret, out.src, out.dst)
		}
	})
	t.Run("UDP to an external IP, zero checksum kept zero", func(t *testing.T) {
		for _, zero := range []bool{false, true} {
			_, out := e.run(TCNodePort, pkt{src: client, dst: ap("192.0.2.50:53"), proto: 17, zeroUDPSum: zero})
			if out.dst != ap("10.244.2.5:8080") || out.src.Addr() != netip.MustParseAddr(nodeIP) || out.zeroUDPSum != zero {
				t.Errorf("UDP (zero checksum %v): %v -> %v, zero after: %v", zero, out.src, out.dst, out.zeroUDPSum)
			}
		}
	})
	t.Run("no endpoints: ICMP port unreachable; not a Service: passed untouched", func(t *testing.T) {
		for _, proto := range []uint8{6, 17} {
			in := pkt{src: client, dst: ap(nodeIP + ":30082"), proto: proto}
			if proto == 17 {
				in.dst = ap(nodeIP + ":30083")
			}
			e.checkUnreachable(t, in)
		}
		p := pkt{src: client, dst: ap(nodeIP + ":22"), proto: 6}
		if ret, out := e.run(TCNodePort, p); ret != -1 || out != p {
			t.Errorf("not a Service: verdict %d, %v -> %v", ret, out.src, out.dst)
		}
	})
}

// Every node picks the same backend for a flow: two datapaths loaded
// separately (two nodes) agree on each of many flows, and the flows spread
// over both backends.
func TestTCConsistentPick(t *testing.T) {
	// Node b knows another Service first: its ids differ from a's.
	other := tcServices()
	other[key("aaa")] = []*proxy.ServicePort{clusterIPPort("aaa", "10.96.0.99", 80, cluster.TCP, ep("10.244.9.9", 80, false))}
	other[key("aaa")][0].NodePort = 30099
	a, b := newTCEnv(t, tcServices()), newTCEnv(t, other)
	seen := map[netip.AddrPort]int{}
	for port := uint16(20000); port < 20100; port++ {
		p := pkt{src: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.9"), port), dst: ap(nodeIP + ":30080"), proto: 6}
		_, oa := a.run(TCNodePort, p)
		_, ob := b.run(TCNodePort, p)
		if oa.dst != ob.dst {
			t.Fatalf("flow from port %d: node a picked %v, node b %v", port, oa.dst, ob.dst)
		}
		seen[oa.dst]++
	}
	if len(seen) != 2 || seen[ap("10.244.1.5:8080")] < 25 {
		t.Errorf("100 flows went %v; want both backends used", seen)
	}
}

// Maglev: with one of ten endpoints gone, flows to the other nine keep
// their backend (compared between two nodes, one with the endpoint, one
// without).
func TestTCMaglevFewFlowsMove(t *testing.T) {
	var eps []proxy.Endpoint
	for i := range 10 {
		eps = append(eps, ep(fmt.Sprintf("10.244.%d.%d", i%3, 10+i), 8080, false))
	}
	svcs := func(eps []proxy.Endpoint) map[cluster.Key][]*proxy.ServicePort {
		sp := clusterIPPort("big", "10.96.0.30", 80, cluster.TCP, eps...)
		sp.NodePort = 30030
		return map[cluster.Key][]*proxy.ServicePort{key("big"): {sp}}
	}
	all, less := newTCEnv(t, svcs(eps)), newTCEnv(t, svcs(append(eps[:4:4], eps[5:]...)))
	gone := eps[4].AddrPort()
	var kept, stayed int
	seen := map[netip.AddrPort]bool{}
	for port := uint16(30000); port < 30400; port++ {
		p := pkt{src: netip.AddrPortFrom(netip.MustParseAddr("198.51.100.7"), port), dst: ap(nodeIP + ":30030"), proto: 6}
		_, before := all.run(TCNodePort, p)
		_, after := less.run(TCNodePort, p)
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
}

// checkUnreachable runs p and checks the answer is an ICMP port
// unreachable to its source, from the address it was sent to, quoting
// its IP header and first 8 bytes, with both checksums right, sent back
// out of the interface p came in on.
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
	if ret != tcRedirect || len(out) != 14+20+8+28 {
		t.Fatalf("%v: verdict %d, %d bytes; want a 70-byte reply redirected", p.dst, ret, len(out))
	}
	if string(out[0:6]) != string(in[6:12]) || string(out[6:12]) != string(in[0:6]) {
		t.Errorf("MACs not swapped: % x", out[:12])
	}
	ip, icmp := out[14:34], out[34:]
	if s := csumFold(csumAdd(0, ip)); s != 0 {
		t.Errorf("bad IP checksum")
	}
	if s := csumFold(csumAdd(0, icmp)); s != 0 {
		t.Errorf("bad ICMP checksum")
	}
	src, dst := netip.AddrFrom4([4]byte(ip[12:16])), netip.AddrFrom4([4]byte(ip[16:20]))
	if ip[9] != 1 || icmp[0] != 3 || icmp[1] != 3 || src != p.dst.Addr() || dst != p.src.Addr() {
		t.Errorf("%v: reply proto %d type %d code %d %v -> %v; want ICMP 3/3 %v -> %v", p.dst, ip[9], icmp[0], icmp[1], src, dst, p.dst.Addr(), p.src.Addr())
	}
	if string(icmp[8:]) != string(in[14:14+28]) {
		t.Errorf("quote % x, want the original IP header and 8 bytes % x", icmp[8:], in[14:42])
	}
}
