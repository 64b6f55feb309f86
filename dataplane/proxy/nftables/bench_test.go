package nftables_test

import (
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	nft "github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/mdlayher/netlink"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

// recorder is a Kernel that keeps the ops of the last transaction instead
// of applying them (an empty table): the Go side of a sync alone.
type recorder struct{ ops []nftables.Op }

func (r *recorder) Objects() ([]*nftables.Chain, []*nftables.Set, error) { return nil, nil, nil }
func (r *recorder) Apply(ops []nftables.Op) error                        { r.ops = ops; return nil }

// wire is what a batch is on the wire: messages and bytes.
type wire struct{ msgs, bytes int }

func dryRun(ops []nftables.Op) (wire, error) {
	var w wire
	err := nftables.ApplyDry(ops, func(req []netlink.Message) ([]netlink.Message, error) {
		if req == nil {
			return nil, io.EOF
		}
		for _, m := range req {
			w.msgs++
			w.bytes += 16 + len(m.Data)
		}
		return nil, nil
	})
	return w, err
}

// objectCount counts what ops create: chains, sets, elements, rules.
func objectCount(ops []nftables.Op) (chains, sets, elems, rules int) {
	for _, op := range ops {
		switch op.Kind {
		case nftables.OpAddChain:
			chains++
		case nftables.OpAddSet:
			sets++
			elems += len(op.Set.Elems)
		case nftables.OpAddElems:
			elems += len(op.Elems)
		case nftables.OpAddRule:
			rules++
		}
	}
	return
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// timed runs f and returns its wall time and the process's CPU time
// (user and system: the kernel runs a netlink batch in the sender's
// system call) while it ran; on a machine shared with other work the CPU
// time is the figure to compare.
func timed(f func()) (wall, cpu time.Duration) {
	c0, w0 := cpuTime(), time.Now()
	f()
	return time.Since(w0), cpuTime() - c0
}

func benchSizes() []int {
	sizes := []int{1000, 10000}
	if s := os.Getenv("PODNET_BENCH_SIZES"); s != "" {
		sizes = nil
		for _, f := range strings.Fields(s) {
			n, _ := strconv.Atoi(f)
			sizes = append(sizes, n)
		}
	}
	return sizes
}

func benchRounds() int {
	if r, err := strconv.Atoi(os.Getenv("PODNET_BENCH_ROUNDS")); err == nil && r > 0 {
		return r
	}
	return 1
}

func median(d []time.Duration) time.Duration {
	d = slices.Clone(d)
	slices.Sort(d)
	if len(d)%2 == 0 {
		return (d[len(d)/2-1] + d[len(d)/2]) / 2
	}
	return d[len(d)/2]
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// syncRound is one round's figures at one size: CPU time (wall time) of
// each phase.
type syncRound struct {
	cpu, wall                         map[string]time.Duration
	wire, changeWire                  wire
	chains, sets, elems, rules, chOps int
}

func (r *syncRound) time(phase string, f func()) {
	r.wall[phase], r.cpu[phase] = timed(f)
}

// phases of a round, in the order of the table's columns.
var phases = []string{"gen", "dry", "full", "bare", "change"}

// BenchmarkSyncAtScale breaks the first full sync and one endpoint change
// of n ClusterIP Services × 10 endpoints down: the Go side building the
// table and its ops, the Go side turning them into netlink messages (sent
// to a fake socket), the real transaction in a namespace's kernel, and the
// same numbers of chains, sets, elements and rules written by
// google/nftables alone in one transaction (the kernel's and the library's
// floor). Each figure is the process's CPU time (wall time in
// parentheses), median of the rounds. PODNET_BENCH=1 only (root).
func BenchmarkSyncAtScale(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	const eps = 10
	fmt.Printf("| Services × endpoints | chains / sets / elements / rules | messages (MiB) | Go: table and ops | Go: netlink messages | full sync | bare library, same objects | one endpoint changed (messages) |\n|---|---|---|---|---|---|---|---|\n")
	for _, n := range benchSizes() {
		var rs []syncRound
		for r := range benchRounds() {
			rs = append(rs, syncRoundAt(b, n, eps, r))
		}
		r := rs[0]
		fmt.Printf("| %d × %d | %d / %d / %d / %d | %d (%.1f) |", n, eps, r.chains, r.sets, r.elems, r.rules, r.wire.msgs, float64(r.wire.bytes)/(1<<20))
		for _, ph := range phases {
			var c, w []time.Duration
			for _, r := range rs {
				c, w = append(c, r.cpu[ph]), append(w, r.wall[ph])
			}
			fmt.Printf(" %.1f ms (%.1f ms)", ms(median(c)), ms(median(w)))
			if ph == "change" {
				fmt.Printf(" (%d)", r.changeWire.msgs)
			}
			fmt.Printf(" |")
		}
		fmt.Println()
	}
}

// benchCfg is proxyd's configuration: the default number of endpoint maps.
var benchCfg = nftables.Config{Family: defaultCfg.Family, ClusterCIDR: defaultCfg.ClusterCIDR}

func syncRoundAt(b *testing.B, n, eps, round int) syncRound {
	out := syncRound{cpu: map[string]time.Duration{}, wall: map[string]time.Duration{}}
	st, state := proxytest.DualStackState(n, eps, false)
	var err error
	rec := &recorder{}
	out.time("gen", func() { _, err = nftables.NewProxier(benchCfg, rec).Sync(state.Ports, nil, true) })
	if err != nil {
		b.Fatal(err)
	}
	out.chains, out.sets, out.elems, out.rules = objectCount(rec.ops)
	out.time("dry", func() { out.wire, err = dryRun(rec.ops) })
	if err != nil {
		b.Fatal(err)
	}

	l := proxytest.NewNetnsLab(b, fmt.Sprintf("ns%d-%d", n, round))
	spy := &spyKernel{Kernel: nftables.Netlink{NetNS: int(l.Node.Fd())}}
	p := nftables.NewProxier(benchCfg, spy)
	out.time("full", func() { _, err = p.Sync(state.Ports, nil, true) })
	if err != nil {
		b.Fatal(err)
	}

	key := cluster.Key{Namespace: "default", Name: fmt.Sprintf("s%05d", n/2)}
	s := st.Service(key)
	st.Upsert(proxytest.Slice(s, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, proxytest.EP(proxytest.A("10.250.250.250"), "node-c", true)))
	changed := state.Update(st, proxytest.NodeName, map[cluster.Key]bool{key: true}, false)
	out.time("change", func() { _, err = p.Sync(state.Ports, changed, false) })
	if err != nil {
		b.Fatal(err)
	}
	out.changeWire, _ = dryRun(spy.ops)
	out.chOps = p.LastOps

	l2 := proxytest.NewNetnsLab(b, fmt.Sprintf("bare%d-%d", n, round))
	out.time("bare", func() { bareWrite(b, int(l2.Node.Fd()), out.chains, out.sets, out.elems, out.rules) })
	return out
}

// spyKernel keeps the ops it applies.
type spyKernel struct {
	nftables.Kernel
	ops []nftables.Op
}

func (s *spyKernel) Apply(ops []nftables.Op) error { s.ops = ops; return s.Kernel.Apply(ops) }

// bareWrite writes a table of chains regular chains holding rules rules
// (one accept each), sets sets of 32-bit keys holding elems elements, in
// one transaction through google/nftables alone, and returns its time.
func bareWrite(b *testing.B, netns, chains, sets, elems, rules int) {
	c, err := nft.New(nft.WithNetNSFd(netns), nft.WithSockOptions(func(c *netlink.Conn) error {
		if err := c.SetWriteBuffer(64 << 20); err != nil {
			return err
		}
		return c.SetReadBuffer(64 << 20)
	}))
	if err != nil {
		b.Fatal(err)
	}
	t := c.AddTable(&nft.Table{Name: "bare", Family: nft.TableFamilyINet})
	var chs []*nft.Chain
	for i := range chains {
		chs = append(chs, c.AddChain(&nft.Chain{Name: fmt.Sprintf("c%d", i), Table: t}))
	}
	for i := range rules {
		c.AddRule(&nft.Rule{Table: t, Chain: chs[i%len(chs)], Exprs: []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}})
	}
	per := elems / max(sets, 1)
	for i := range sets {
		s := &nft.Set{Table: t, Name: fmt.Sprintf("s%d", i), KeyType: nft.TypeInteger}
		var el []nft.SetElement
		if i == sets-1 {
			per = elems - per*(sets-1)
		}
		for j := range per {
			el = append(el, nft.SetElement{Key: []byte{byte(j), byte(j >> 8), byte(j >> 16), 0}})
		}
		if err := c.AddSet(s, nil); err != nil {
			b.Fatal(err)
		}
		for len(el) > 0 {
			part := el[:min(len(el), 1000)]
			el = el[len(part):]
			if err := c.SetAddElements(s, part); err != nil {
				b.Fatal(err)
			}
		}
	}
	if err := c.Flush(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkEndpointChange: at 10,000 Services × 10 endpoints, the CPU time
// of one partial sync, mean of 200 Services changed one after the other:
// one endpoint replaced (element updates only) and 10 endpoints down to 1
// (numgen's modulus changes: the port's rule is rewritten, and a rule
// added makes the kernel validate the whole table at commit).
// PODNET_BENCH=1 only (root).
func BenchmarkEndpointChange(b *testing.B) {
	if os.Getenv("PODNET_BENCH") == "" {
		roottest.Optional(b, "set PODNET_BENCH=1")
	}
	roottest.Require(b)
	const n, changes = 10000, 200
	fmt.Printf("| 10,000 × 10, mean of %d partial syncs | CPU | wall |\n|---|---|---|\n", changes)
	for _, down := range []bool{false, true} {
		st, state := proxytest.DualStackState(n, 10, false)
		l := proxytest.NewNetnsLab(b, fmt.Sprintf("chg%v", down))
		p := nftables.NewProxier(benchCfg, nftables.Netlink{NetNS: int(l.Node.Fd())})
		if _, err := p.Sync(state.Ports, nil, true); err != nil {
			b.Fatal(err)
		}
		var cpu, wall time.Duration
		for i := range changes {
			key := cluster.Key{Namespace: "default", Name: fmt.Sprintf("s%05d", n/2+i)}
			var e []proxytest.Endpoint
			for j := range 10 {
				a := proxytest.A(fmt.Sprintf("10.%d.%d.%d", 245+j, (n/2+i)/250, (n/2+i)%250+1))
				if j == 3 {
					a = proxytest.A("10.250.250.250")
				}
				e = append(e, proxytest.EP(a, "node-b", true))
			}
			if down {
				e = e[:1]
			}
			st.Upsert(proxytest.Slice(st.Service(key), []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, e...))
			changed := state.Update(st, proxytest.NodeName, map[cluster.Key]bool{key: true}, false)
			var err error
			w, c := timed(func() { _, err = p.Sync(state.Ports, changed, false) })
			if err != nil {
				b.Fatal(err)
			}
			cpu, wall = cpu+c, wall+w
		}
		what := "one endpoint replaced"
		if down {
			what = "10 endpoints down to 1"
		}
		fmt.Printf("| %s | %.2f ms | %.2f ms |\n", what, ms(cpu/changes), ms(wall/changes))
	}
}
