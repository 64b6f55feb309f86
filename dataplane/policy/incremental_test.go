package policy

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/podnet/podnet/dataplane/cluster"
)

// world is a random cluster the incremental test changes one object at a
// time: pod slots with fixed addresses (one pod per address), namespaces
// and policies drawn from small alphabets so selectors often match.
type world struct {
	rnd  *rand.Rand
	t    *testing.T
	pods map[cluster.Key]*cluster.Pod
	nss  map[string]*cluster.Namespace
	pols map[cluster.Key]*cluster.NetworkPolicy
}

var (
	wNamespaces = []string{"n0", "n1", "n2", "n3"}
	wValues     = []string{"a", "b", "c"}
)

func (w *world) pick(l []string) string { return l[w.rnd.IntN(len(l))] }

func (w *world) labels() map[string]string {
	out := map[string]string{}
	for _, k := range []string{"app", "team"} {
		if w.rnd.IntN(3) > 0 {
			out[k] = w.pick(wValues)
		}
	}
	return out
}

// pod is a new version of the pod in slot i (its addresses are the slot's).
func (w *world) pod(i int) *cluster.Pod {
	p := &cluster.Pod{Namespace: wNamespaces[i%len(wNamespaces)], Name: fmt.Sprintf("p%d", i), Labels: w.labels(),
		NodeName: w.pick([]string{"node1", "node2"}), HostNetwork: w.rnd.IntN(20) == 0,
		IPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, 0, byte(i + 1)}), netip.MustParseAddr(fmt.Sprintf("fd00:10:244::%x", i+1))}}
	if w.rnd.IntN(2) == 0 {
		p.Ports = append(p.Ports, cluster.NamedPort{Name: "http", Protocol: cluster.TCP, Port: uint16(8000 + w.rnd.IntN(3))})
	}
	if w.rnd.IntN(3) == 0 {
		p.Ports = append(p.Ports, cluster.NamedPort{Name: "dns", Protocol: cluster.UDP, Port: 53})
	}
	return p
}

func (w *world) selector() string {
	switch w.rnd.IntN(3) {
	case 0:
		return "{}"
	case 1:
		return fmt.Sprintf("{matchLabels: {app: %s}}", w.pick(wValues))
	}
	return fmt.Sprintf("{matchExpressions: [{key: team, operator: NotIn, values: [%s]}]}", w.pick(wValues))
}

func (w *world) peer() string {
	switch w.rnd.IntN(5) {
	case 0:
		return "{podSelector: " + w.selector() + "}"
	case 1:
		return "{namespaceSelector: " + w.selector() + "}"
	case 2:
		return "{namespaceSelector: " + w.selector() + ", podSelector: " + w.selector() + "}"
	case 3:
		return `{ipBlock: {cidr: 10.244.0.0/24, except: [10.244.0.16/28]}}`
	}
	return `{ipBlock: {cidr: "fd00:10:244::/120"}}`
}

func (w *world) rule(dir string) string {
	var peers, ports []string
	for range w.rnd.IntN(3) {
		peers = append(peers, w.peer())
	}
	for range w.rnd.IntN(3) {
		ports = append(ports, w.pick([]string{"{port: http}", "{protocol: UDP, port: dns}", "{port: 80}", "{port: 8000, endPort: 8001}"}))
	}
	var b strings.Builder
	b.WriteString("{")
	if len(peers) > 0 {
		fmt.Fprintf(&b, "%s: [%s], ", dir, strings.Join(peers, ", "))
	}
	if len(ports) > 0 {
		fmt.Fprintf(&b, "ports: [%s]", strings.Join(ports, ", "))
	}
	return b.String() + "}"
}

func (w *world) policy(ns, name string) *cluster.NetworkPolicy {
	var in, eg []string
	for range w.rnd.IntN(3) {
		in = append(in, w.rule("from"))
	}
	for range w.rnd.IntN(3) {
		eg = append(eg, w.rule("to"))
	}
	types := w.pick([]string{"[Ingress]", "[Egress]", "[Ingress, Egress]"})
	doc := fmt.Sprintf("metadata: {namespace: %s, name: %s}\nspec: {podSelector: %s, policyTypes: %s, ingress: [%s], egress: [%s]}",
		ns, name, w.selector(), types, strings.Join(in, ", "), strings.Join(eg, ", "))
	return mustPolicies(w.t, doc)[0]
}

// step changes one object in w and in c alike and says what it did.
func (w *world) step(c *Compiler, slots int) string {
	switch n := w.rnd.IntN(10); {
	case n < 5:
		p := w.pod(w.rnd.IntN(slots))
		w.pods[p.Key()] = p
		c.UpsertPod(p)
		return "upsert pod " + p.Key().String()
	case n < 6:
		k := cluster.Key{Namespace: wNamespaces[0], Name: fmt.Sprintf("p%d", 4*w.rnd.IntN(slots/4))}
		delete(w.pods, k)
		c.DeletePod(k)
		return "delete pod " + k.String()
	case n < 8:
		ns := &cluster.Namespace{Name: w.pick(wNamespaces), Labels: w.labels()}
		if w.rnd.IntN(5) == 0 {
			delete(w.nss, ns.Name)
			c.DeleteNamespace(ns.Name)
			return "delete namespace " + ns.Name
		}
		w.nss[ns.Name] = ns
		c.UpsertNamespace(ns)
		return "upsert namespace " + ns.Name
	case n < 9:
		np := w.policy(w.pick(wNamespaces), fmt.Sprintf("np%d", w.rnd.IntN(6)))
		w.pols[np.Key()] = np
		c.UpsertPolicy(np)
		return "upsert policy " + np.Key().String()
	}
	k := cluster.Key{Namespace: w.pick(wNamespaces), Name: fmt.Sprintf("np%d", w.rnd.IntN(6))}
	delete(w.pols, k)
	c.DeletePolicy(k)
	return "delete policy " + k.String()
}

func (w *world) compile() *Program {
	var pods []*cluster.Pod
	for _, p := range w.pods {
		pods = append(pods, p)
	}
	var nss []*cluster.Namespace
	for _, n := range w.nss {
		nss = append(nss, n)
	}
	var pols []*cluster.NetworkPolicy
	for _, np := range w.pols {
		pols = append(pols, np)
	}
	return NewModel(pods, nss, pols).Compile(onNode("node1"))
}

// dump prints a program's policies by value, to see whether one handed
// out was changed afterwards.
func dump(p *Program) string {
	var b strings.Builder
	for _, pp := range p.Policies {
		fmt.Fprintf(&b, "%+v\n", *pp)
	}
	return b.String()
}

// TestIncrementalEqualsFullCompile changes a random cluster one object at a
// time (pods added, relabelled, moved between nodes and deleted, namespaces
// relabelled and deleted, policies replaced and deleted) and after every
// step compares the Compiler's program with a whole compile of the same
// objects; a program handed out before a step must be left as it was.
func TestIncrementalEqualsFullCompile(t *testing.T) {
	for seed := range uint64(10) {
		w := &world{rnd: rand.New(rand.NewPCG(seed, 24)), t: t, pods: map[cluster.Key]*cluster.Pod{},
			nss: map[string]*cluster.Namespace{}, pols: map[cluster.Key]*cluster.NetworkPolicy{}}
		const slots = 40
		for i := range slots / 2 {
			p := w.pod(i)
			w.pods[p.Key()] = p
		}
		for _, ns := range wNamespaces[1:] {
			w.nss[ns] = &cluster.Namespace{Name: ns, Labels: w.labels()}
		}
		for i := range 4 {
			np := w.policy(w.pick(wNamespaces), fmt.Sprintf("np%d", i))
			w.pols[np.Key()] = np
		}
		full := w.compile()
		c := NewCompiler(NewModel(slices.Collect(maps.Values(w.pods)), slices.Collect(maps.Values(w.nss)), slices.Collect(maps.Values(w.pols))), onNode("node1"))
		selecting := 0
		for i := range 200 {
			prev := c.Program()
			before := dump(prev)
			what := w.step(c, slots)
			got, want := c.Program(), w.compile()
			// %+v prints nil and empty slices alike, as the Table
			// treats them; cmp only explains a difference.
			if dump(got) != dump(want) {
				diff := cmp.Diff(want, got, cmpopts.EquateEmpty(), cmpopts.EquateComparable(netip.Addr{}))
				t.Fatalf("seed %d step %d (%s): incremental differs from a full compile (-full +incremental):\n%s", seed, i, what, diff)
			}
			if after := dump(prev); after != before {
				t.Fatalf("seed %d step %d (%s): the program handed out before the step changed:\n%s\nnow:\n%s", seed, i, what, before, after)
			}
			selecting += len(got.Policies)
		}
		if len(full.Policies)+selecting == 0 {
			t.Fatalf("seed %d: no policy ever selected a pod of node1: the test proves nothing", seed)
		}
	}
}
