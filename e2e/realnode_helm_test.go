//go:build conformance

package e2e

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/e2e/chart"
	"github.com/podnet/podnet/e2e/lab"
)

// TestRealNodeHelm installs podnet from its Helm chart (deploy/helm/podnet,
// rendered by Helm's Go packages as `helm template` does, then applied)
// on a kubelet + containerd node, with values that differ from deploy/'s
// defaults: the image's own tag and the nftables proxy mode. A pod then
// resolves a Service's name through the chart's kube-dns address and
// reaches it, and proxyd runs with the mode the values chose.
func TestRealNodeHelm(t *testing.T) {
	install := func(ctx context.Context, c *realCluster, podnetTar string) {
		repo, tag := imageRepoTag(t, podnetTar)
		manifests, err := chart.Render("../deploy/helm/podnet", map[string]any{
			"image":     map[string]any{"repository": repo, "tag": tag},
			"proxyMode": "nftables",
		})
		if err != nil {
			t.Fatal(err)
		}
		c.createAPIServerConfigMap(ctx)
		c.applyYAML(ctx, manifests)
		c.waitNetworkUp("podnet-dns")
	}
	c := startRealClusterOpts(t, []lab.NodeSpec{{Name: "node1", IP: netip.MustParsePrefix("192.168.10.11/24")}}, realClusterOptions{install: install})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	ds, err := c.admin.AppsV1().DaemonSets("podnet-system").Get(ctx, "podnet-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p := container(ds.Spec.Template.Spec.Containers, "proxyd"); p == nil || lastFlag(p.Command, "proxy-mode") != "nftables" {
		c.errorf("the chart's podnet-node runs proxyd %v, want --proxy-mode=nftables", p)
	}
	c.startWeb(ctx)
	c.checkWeb(ctx)
	// The Services are in nftables mode's own table, as proxyd status
	// reads it from the kernel.
	out, err := c.kubectl(ctx, "-n", "podnet-system", "exec", "daemonset/podnet-node", "-c", "proxyd", "--", "proxyd", "status")
	if err != nil || !strings.Contains(out, "nftables table inet podnet:") {
		c.errorf("proxyd status on the node: %v\n%s", err, out)
	}
}
