package policy

import (
	"fmt"
	"slices"
	"testing"
)

// Rules of different policies whose pod peers read alike but take different
// pods: a podSelector without namespaceSelector takes the policy's own
// namespace's pods, and with one it takes those of every namespace it picks.
const (
	// aFromClients lets a/web in from the clients of a (there are none).
	aFromClients = `
metadata: {namespace: a, name: from-clients}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 80}]}]`
	// aFromClientsToo is the same rule again in another policy: it shares
	// from-clients' peer set.
	aFromClientsToo = `
metadata: {namespace: a, name: from-clients-too}
spec:
  podSelector: {matchLabels: {app: web}}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 81}]}]`
	// bFromClients lets b/client in from b's clients: itself.
	bFromClients = `
metadata: {namespace: b, name: from-clients}
spec:
  podSelector: {}
  ingress: [{from: [{podSelector: {matchLabels: {app: client}}}], ports: [{port: 80}]}]`
	// cFromAnyClients lets c/client in from the clients of every
	// namespace.
	cFromAnyClients = `
metadata: {namespace: c, name: from-any-clients}
spec:
  podSelector: {}
  ingress: [{from: [{namespaceSelector: {}, podSelector: {matchLabels: {app: client}}}], ports: [{port: 80}]}]`
)

// TestSharedPeerSetsKeepDifferentPeersApart: rules whose peers resolve alike
// share one set in the table, and rules whose peers differ never do, even
// when their podSelectors are the same text. If the table merged
// from-clients of a with that of b (the same podSelector, another
// namespace) or with c's (the same podSelector under a namespaceSelector),
// a/web would let b/client or c/client in on port 80.
func TestSharedPeerSetsKeepDifferentPeersApart(t *testing.T) {
	n := newTestNode(t)
	n.serve("a/web", 80)
	n.serve("a/web", 81)
	n.serve("c/client", 80)
	pods, nss := rootFixture()
	tbl := n.table()
	t.Cleanup(func() { tbl.Remove() })
	apply := func(step string, docs ...string) {
		t.Helper()
		if err := tbl.Apply(NewModel(pods, nss, mustPolicies(t, docs...)).Compile(onNode("node1"))); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	all := []string{aFromClients, aFromClientsToo, bFromClients, cFromAnyClients}
	// The program lists a's policies first, so a's (empty) peers come
	// first in the full apply; after c's policy alone, c's peers are the
	// set that is there before the others arrive incrementally. A wrong
	// merge keeps whichever came first.
	for _, steps := range [][][]string{{all}, {{cFromAnyClients}, all}} {
		for i, docs := range steps {
			apply(fmt.Sprintf("step %d", i), docs...)
		}
		if got := len(tbl.peers); got != 3 {
			t.Errorf("%d peer sets for 4 rules with 3 different peers, want 3", got)
		}
		peersAgree(t, tbl)
		n.expect(fmt.Sprintf("peers kept apart, after %d applies", len(steps)),
			probe{"b/client", "tcp", "r/web", 80, false}, probe{"c/client", "tcp", "r/web6", 80, false},
			probe{"b/client", "tcp", "r/web", 81, false}, probe{"b/client", "tcp", "r/c", 80, true},
			probe{"b/client", "tcp", "r/c6", 80, true}, probe{"far", "tcp", "r/c", 80, false})
		apply("no policy")
	}
}

// peersAgree checks that every rule's pod peers are what its shared set
// holds.
func peersAgree(t *testing.T, tbl *Table) {
	t.Helper()
	for k, inst := range tbl.applied {
		for d, dir := range inst.prog.Dir {
			for i, r := range dir.Rules {
				if !r.HasPodPeers {
					continue
				}
				if ps := tbl.peers[r.PeerKey]; ps == nil || !slices.Equal(ps.addrs, r.Pods) {
					t.Errorf("%s %s rule %d: its peer set does not hold its peers %v", k, Direction(d), i, r.Pods)
				}
			}
		}
	}
}
