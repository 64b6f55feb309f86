package policy

import (
	"fmt"
	"net/netip"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
)

// fixture is three namespaces with pods in both families: a (team=a) holds
// web (named port http 80/TCP, dns 53/UDP) and db, b (team=b) and c (no
// labels) each a client, plus a hostNetwork pod in a.
func fixture() ([]*cluster.Pod, []*cluster.Namespace) {
	pod := func(ns, name, v4, v6 string, lbl map[string]string, ports ...cluster.NamedPort) *cluster.Pod {
		return &cluster.Pod{Namespace: ns, Name: name, Labels: lbl, Ports: ports, NodeName: "node1",
			IPs: []netip.Addr{netip.MustParseAddr(v4), netip.MustParseAddr(v6)}}
	}
	pods := []*cluster.Pod{
		pod("a", "web", "10.244.1.2", "fd00:10:244:1::2", map[string]string{"app": "web"},
			cluster.NamedPort{Name: "http", Protocol: cluster.TCP, Port: 80},
			cluster.NamedPort{Name: "dns", Protocol: cluster.UDP, Port: 53}),
		pod("a", "db", "10.244.1.3", "fd00:10:244:1::3", map[string]string{"app": "db"},
			cluster.NamedPort{Name: "http", Protocol: cluster.TCP, Port: 8080}),
		pod("b", "client", "10.244.2.2", "fd00:10:244:2::2", map[string]string{"app": "client"}),
		pod("c", "client", "10.244.2.3", "fd00:10:244:2::3", map[string]string{"app": "client"}),
		{Namespace: "a", Name: "host", HostNetwork: true, Labels: map[string]string{"app": "web"},
			IPs: []netip.Addr{netip.MustParseAddr("192.168.10.11")}},
	}
	nss := []*cluster.Namespace{
		{Name: "a", Labels: map[string]string{"team": "a"}},
		{Name: "b", Labels: map[string]string{"team": "b"}},
		{Name: "c"},
	}
	return pods, nss
}

func mustPolicies(t testing.TB, docs ...string) []*cluster.NetworkPolicy {
	t.Helper()
	var out []*cluster.NetworkPolicy
	for i, d := range docs {
		var np networkingv1.NetworkPolicy
		if err := yaml.UnmarshalStrict([]byte(d), &np); err != nil {
			t.Fatalf("policy %d: %v", i, err)
		}
		if np.Name == "" {
			np.Name = fmt.Sprintf("p%d", i)
		}
		c, err := convert.FromV1NetworkPolicy(&np)
		if err != nil {
			t.Fatalf("policy %d: %v", i, err)
		}
		out = append(out, c)
	}
	return out
}

// ip names a pod's address of the family: "a/web" or "a/web6".
var ips = map[string]string{
	"a/web": "10.244.1.2", "a/db": "10.244.1.3", "b/client": "10.244.2.2", "c/client": "10.244.2.3",
	"a/web6": "fd00:10:244:1::2", "a/db6": "fd00:10:244:1::3", "b/client6": "fd00:10:244:2::2", "c/client6": "fd00:10:244:2::3",
	"host": "192.168.10.11", "out": "203.0.113.9", "out-ex": "203.0.113.200", "out6": "2001:db8::9",
}

type check struct {
	src, dst string
	proto    cluster.Protocol
	port     uint16
	allow    bool
}

func (c check) flow() Flow {
	return Flow{Src: netip.MustParseAddr(ips[c.src]), Dst: netip.MustParseAddr(ips[c.dst]), Protocol: c.proto, Port: c.port}
}

func allow(src, dst string, proto cluster.Protocol, port uint16) check {
	return check{src, dst, proto, port, true}
}
func deny(src, dst string, proto cluster.Protocol, port uint16) check {
	return check{src, dst, proto, port, false}
}

const tcp, udp, sctp = cluster.TCP, cluster.UDP, cluster.SCTP

// modelCases are the NetworkPolicy semantics as the API documents them, as a
// table of flows and verdicts; the compiled program is checked on the same.
var modelCases = []struct {
	name     string
	policies []string
	checks   []check
}{
	{"no policy allows everything", nil, []check{
		allow("b/client", "a/web", tcp, 80), allow("a/web", "c/client", udp, 9), allow("out", "a/db", sctp, 1),
		allow("b/client6", "a/web6", tcp, 80),
	}},
	{"default deny ingress isolates the namespace's pods only for ingress", []string{`
metadata: {namespace: a}
spec: {podSelector: {}, policyTypes: [Ingress]}`}, []check{
		deny("b/client", "a/web", tcp, 80), deny("a/db", "a/web", udp, 53), deny("out", "a/db", tcp, 1),
		deny("b/client6", "a/web6", tcp, 80),
		allow("a/web", "b/client", tcp, 80), allow("b/client", "c/client", tcp, 80), allow("host", "b/client", tcp, 1),
	}},
	{"allow all ingress with an empty rule", []string{`
metadata: {namespace: a}
spec: {podSelector: {}, policyTypes: [Ingress]}`, `
metadata: {namespace: a}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{}]}`}, []check{
		allow("b/client", "a/web", tcp, 80), allow("out", "a/web", udp, 1), allow("c/client6", "a/web6", sctp, 7),
		deny("b/client", "a/db", tcp, 8080),
	}},
	{"podSelector peer means pods of the policy's namespace", []string{`
metadata: {namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: db}}}]}]`}, []check{
		allow("a/db", "a/web", tcp, 80), allow("a/db6", "a/web6", udp, 53),
		deny("b/client", "a/web", tcp, 80), deny("c/client", "a/web", tcp, 80), deny("out", "a/web", tcp, 80),
		allow("b/client", "a/db", tcp, 8080),
	}},
	{"namespaceSelector peer means every pod of those namespaces", []string{`
metadata: {namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: b}}}]}]`}, []check{
		allow("b/client", "a/web", tcp, 80), allow("b/client6", "a/db6", udp, 1),
		deny("c/client", "a/web", tcp, 80), deny("a/db", "a/web", tcp, 80),
	}},
	{"namespaceSelector and podSelector together are one peer (and)", []string{`
metadata: {namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}]}]`}, []check{
		allow("b/client", "a/web", tcp, 80), allow("c/client", "a/web", tcp, 80),
		deny("a/db", "a/web", tcp, 80), deny("out", "a/web", tcp, 80),
	}},
	{"namespaceSelector and podSelector as two peers are either (or)", []string{`
metadata: {namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: team, operator: In, values: [b]}]}}, {podSelector: {matchLabels: {app: db}}}]}]`}, []check{
		allow("b/client", "a/web", tcp, 80), allow("a/db", "a/web", tcp, 80),
		deny("c/client", "a/web", tcp, 80),
	}},
	{"ipBlock with except, by family", []string{`
metadata: {namespace: a}
spec:
  podSelector: {}
  ingress:
  - from: [{ipBlock: {cidr: 203.0.113.0/24, except: [203.0.113.128/25]}}, {ipBlock: {cidr: "2001:db8::/64"}}, {ipBlock: {cidr: 10.244.2.0/24, except: [10.244.2.3/32]}}]`}, []check{
		allow("out", "a/web", tcp, 80), deny("out-ex", "a/web", tcp, 80), allow("out6", "a/web6", tcp, 80),
		allow("b/client", "a/web", tcp, 80), deny("c/client", "a/web", tcp, 80), deny("b/client6", "a/web6", tcp, 80),
	}},
	{"ports by protocol, range and name", []string{`
metadata: {namespace: a}
spec:
  podSelector: {}
  ingress:
  - ports: [{port: 80}, {protocol: UDP, port: 8000, endPort: 8010}, {protocol: TCP, port: http}, {protocol: SCTP}]`}, []check{
		allow("b/client", "a/web", tcp, 80), deny("b/client", "a/web", udp, 80), deny("b/client", "a/web", tcp, 81),
		allow("b/client", "a/web", udp, 8000), allow("b/client6", "a/web6", udp, 8010), deny("b/client", "a/web", udp, 8011),
		allow("b/client", "a/db", tcp, 8080), deny("b/client", "a/web", tcp, 8080),
		allow("c/client", "a/db", sctp, 9), deny("c/client", "a/db", udp, 9),
	}},
	{"default deny egress with an exception by namespace and named port", []string{`
metadata: {namespace: a}
spec: {podSelector: {}, policyTypes: [Egress]}`, `
metadata: {namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  policyTypes: [Egress]
  egress: [{to: [{namespaceSelector: {matchLabels: {team: a}}}], ports: [{port: http}]}]`}, []check{
		allow("a/web", "a/db", tcp, 8080), allow("a/web6", "a/db6", tcp, 8080), deny("a/web", "a/db", tcp, 80),
		deny("a/web", "b/client", tcp, 80), deny("a/db", "a/web", tcp, 80), deny("a/web", "out", tcp, 80),
		allow("b/client", "a/web", tcp, 80), allow("out", "a/db", tcp, 1),
	}},
	{"egress and ingress both must allow", []string{`
metadata: {namespace: b}
spec:
  podSelector: {}
  egress: [{to: [{ipBlock: {cidr: 10.244.1.0/24}}]}]`, `
metadata: {namespace: a}
spec:
  podSelector: {matchLabels: {app: db}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: b}}}], ports: [{port: 8080}]}]`}, []check{
		allow("b/client", "a/db", tcp, 8080), deny("b/client", "a/db", tcp, 80), allow("b/client", "a/web", tcp, 80),
		deny("b/client", "c/client", tcp, 80), deny("b/client6", "a/web6", tcp, 80), deny("b/client", "a/db", udp, 8080),
	}},
	{"hostNetwork pods are neither selected nor selectable", []string{`
metadata: {namespace: a}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: web}}}]}]
  egress: [{to: [{podSelector: {matchLabels: {app: web}}}]}]`}, []check{
		deny("host", "a/web", tcp, 80), allow("host", "b/client", tcp, 80), deny("a/web", "host", tcp, 80),
	}},
	{"a namespace without labels matches only the empty namespaceSelector", []string{`
metadata: {namespace: a}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {matchExpressions: [{key: team, operator: DoesNotExist}]}}]}]`}, []check{
		allow("c/client", "a/web", tcp, 80), deny("b/client", "a/web", tcp, 80), deny("a/db", "a/web", tcp, 80),
	}},
}

func TestModel(t *testing.T) {
	pods, nss := fixture()
	for _, tc := range modelCases {
		t.Run(tc.name, func(t *testing.T) {
			m := NewModel(pods, nss, mustPolicies(t, tc.policies...))
			for _, c := range tc.checks {
				if got := m.Evaluate(c.flow()).Allowed; got != c.allow {
					t.Errorf("%s -> %s %s/%d: allowed %v, want %v", c.src, c.dst, c.proto, c.port, got, c.allow)
				}
			}
		})
	}
}

func TestVerdictNamesTheSelectingPolicies(t *testing.T) {
	pods, nss := fixture()
	pols := mustPolicies(t, `
metadata: {namespace: a, name: deny-all}
spec: {podSelector: {}, policyTypes: [Ingress, Egress]}`, `
metadata: {namespace: a, name: web-in}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{ports: [{port: 80}]}]}`)
	m := NewModel(pods, nss, pols)
	v := m.Evaluate(deny("a/db", "a/web", tcp, 80).flow())
	if v.Allowed || v.DeniedBy != Egress {
		t.Fatalf("db -> web:80 = %+v, want denied by egress", v)
	}
	want := []cluster.Key{{Namespace: "a", Name: "deny-all"}, {Namespace: "a", Name: "web-in"}}
	if fmt.Sprint(v.Ingress) != fmt.Sprint(want) || fmt.Sprint(v.Egress) != fmt.Sprint(want[:1]) {
		t.Errorf("selecting: egress %v ingress %v, want egress %v ingress %v", v.Egress, v.Ingress, want[:1], want)
	}
	if v := m.Evaluate(allow("b/client", "a/web", tcp, 80).flow()); !v.Allowed || len(v.Egress) != 0 {
		t.Errorf("b/client -> web:80 = %+v, want allowed with no egress policy", v)
	}
}

func TestPodStatusesSayWhatPoliciesAllow(t *testing.T) {
	pods, nss := fixture()
	pols := mustPolicies(t, `
metadata: {namespace: a, name: web-in}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress:
  - from: [{namespaceSelector: {matchLabels: {team: b}}, podSelector: {matchLabels: {app: client}}}, {ipBlock: {cidr: 10.0.0.0/8, except: [10.1.0.0/16]}}]
    ports: [{port: 80}, {protocol: UDP, port: dns}, {port: 8000, endPort: 8080}]
  - {}`, `
metadata: {namespace: a, name: deny-egress}
spec: {podSelector: {}, policyTypes: [Egress]}`)
	got := NewModel(pods, nss, pols).PodStatuses(onNode("node1"))
	want := `[{a/db [] [{a/deny-egress []}]} {a/web [{a/web-in [from pods app=client of namespaces team=b; 10.0.0.0/8 except [10.1.0.0/16] on TCP/80, UDP/dns, TCP/8000-8080 from anyone on any port]}] [{a/deny-egress []}]}]`
	if fmt.Sprint(got) != want {
		t.Errorf("statuses\n%v\nwant\n%s", got, want)
	}
}

// TestRemovedPodsAddressGoesToTheOtherClaimant: when two pods claim one
// address, removing the one that holds it gives it to the other, and
// removing that one too leaves it to no pod.
func TestRemovedPodsAddressGoesToTheOtherClaimant(t *testing.T) {
	a := netip.MustParseAddr("10.244.1.9")
	p1 := &cluster.Pod{Namespace: "a", Name: "one", IPs: []netip.Addr{a}}
	p2 := &cluster.Pod{Namespace: "b", Name: "two", IPs: []netip.Addr{a, netip.MustParseAddr("fd00::9")}}
	m := NewModel([]*cluster.Pod{p1, p2}, nil, nil)
	if m.Pod(a) != p2 {
		t.Fatalf("%s held by %v, want the later pod b/two", a, m.Pod(a))
	}
	m.removePod(p2.Key())
	if m.Pod(a) != p1 {
		t.Errorf("after b/two left, %s is held by %v, want a/one", a, m.Pod(a))
	}
	m.removePod(p1.Key())
	if m.Pod(a) != nil || len(m.claims) != 0 {
		t.Errorf("after both left, %s is held by %v and %d addresses are claimed, want none", a, m.Pod(a), len(m.claims))
	}
}
