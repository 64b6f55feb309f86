package e2e

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/e2e/apiserver"
)

// deploy/'s RBAC, as the real API server enforces it, lets proxyd's service
// account list and watch every kind proxyd --network-policy reads (the
// kinds are the agent's own, so a kind added there and not to deploy/ fails
// here): the kube source, run as that account, syncs. Run as dnsd's
// account, which may not read NetworkPolicies, the same source is refused
// (the check can fail).
func TestKubePolicyRBAC(t *testing.T) {
	_, srv := kubeAPI(t)
	kinds := agent.Options{NetworkPolicy: true}.Kinds()
	for _, k := range []cluster.Kind{cluster.KindPod, cluster.KindNamespace, cluster.KindNetworkPolicy} {
		if !slices.Contains(kinds, k) {
			t.Fatalf("proxyd --network-policy watches %v, not %v", kinds, k)
		}
	}
	run := func(user string) (*cluster.Store, *kube.Source) {
		client, err := srv.Client(user)
		if err != nil {
			t.Fatal(err)
		}
		store := cluster.NewStore()
		src := kube.New(kube.Options{Client: client, Store: store, Kinds: kinds})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := src.Run(ctx); err != nil {
				t.Errorf("kube source as %s: %v", user, err)
			}
		}()
		t.Cleanup(func() { cancel(); <-done })
		return store, src
	}
	store, src := run(apiserver.NodeSA)
	select {
	case <-store.Synced():
		if err := src.Err(); err != nil {
			t.Errorf("synced as %s, yet: %v", apiserver.NodeSA, err)
		}
		t.Logf("%s lists and watches %v", apiserver.NodeSA, kinds)
	case <-time.After(time.Minute):
		t.Fatalf("%s: the kube source did not sync %v in a minute: %v", apiserver.NodeSA, kinds, src.Err())
	}

	store, src = run(apiserver.DNSSA)
	waitUntil(t, time.Minute, func() bool {
		err := src.Err()
		return err != nil && strings.Contains(err.Error(), "forbidden") && strings.Contains(err.Error(), "networkpolicies")
	}, "dnsd's account refused NetworkPolicies")
	select {
	case <-store.Synced():
		t.Errorf("%s synced %v without the right to read NetworkPolicies", apiserver.DNSSA, kinds)
	default:
	}
	t.Logf("%s refused: %v", apiserver.DNSSA, src.Err())
}
