package policy

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
)

// TestDeniedConnectionsAreLogged: a connection the table drops reaches
// ListenDenied through the nflog group, with its direction, addresses,
// protocol and port, in both families and both directions; the log record
// names the pods and the policies that selected the pod.
func TestDeniedConnectionsAreLogged(t *testing.T) {
	n := newTestNode(t)
	n.serve("a/web", 80)
	n.serve("c/client", 80)
	pods, nss := rootFixture()
	m := NewModel(pods, nss, mustPolicies(t, webIn, bEgress))
	tbl := n.table()
	t.Cleanup(func() { tbl.Remove() })
	if err := tbl.Apply(m.Compile(onNode("node1"))); err != nil {
		t.Fatal(err)
	}
	logged := make(chan Denied, 100)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- n.node.Do(func(ns.NetNS) error {
			return ListenDenied(ctx, 24, func(d Denied) { logged <- d })
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("ListenDenied: %v", err)
		}
	})
	for _, tc := range []struct {
		from, to, src, dst string
		dir                Direction
		policies           []string
	}{
		{"c/client", "r/web", "c/client", "a/web", Ingress, []string{"a/web-in"}},
		{"c/client", "r/web6", "c/client", "a/web", Ingress, []string{"a/web-in"}},
		{"b/client", "r/c", "b/client", "c/client", Egress, []string{"b/out-to-web"}},
		{"b/client", "r/c6", "b/client", "c/client", Egress, []string{"b/out-to-web"}},
	} {
		want := Denied{Direction: tc.dir, Flow: Flow{Src: netip.MustParseAddr(ips[n.addrKey(tc.from, tc.to)]),
			Dst: netip.MustParseAddr(ips[tc.to]), Protocol: cluster.TCP, Port: 80}}
		got := n.awaitDenied(logged, tc.from, tc.to, want)
		attrs := fmt.Sprint(describeDenied(m, got))
		wantAttrs := fmt.Sprint([]any{"direction", tc.dir.String(), "src", tc.src, "dst", tc.dst, "protocol", "TCP", "port", uint16(80),
			"srcIP", want.Src.String(), "dstIP", want.Dst.String(), "policies", tc.policies})
		if attrs != wantAttrs {
			t.Errorf("%s -> %s logged as %s, want %s", tc.from, tc.to, attrs, wantAttrs)
		}
	}
}

// addrKey is the ips key of from's address in to's family.
func (n *testNode) addrKey(from, to string) string {
	k := map[string]string{"a/web": "r/web", "b/client": "r/b", "c/client": "r/c"}[from]
	if netip.MustParseAddr(ips[to]).Is6() {
		k += "6"
	}
	return k
}

// awaitDenied tries a denied connection until the log reports it (the
// listener binds in the background), at most 10 times.
func (n *testNode) awaitDenied(logged chan Denied, from, to string, want Denied) Denied {
	n.t.Helper()
	var seen []Denied
	for range 10 {
		if n.reach(from, "tcp", netip.MustParseAddr(ips[to]), 80) {
			n.t.Fatalf("%s reached %s: the policy should deny it", from, to)
		}
		for deadline := time.After(time.Second); ; {
			select {
			case d := <-logged:
				if d == want {
					return d
				}
				seen = append(seen, d)
				continue
			case <-deadline:
			}
			break
		}
	}
	n.t.Fatalf("%s -> %s: no log of %+v; logged %v", from, to, want, slices.Compact(seen))
	return Denied{}
}
