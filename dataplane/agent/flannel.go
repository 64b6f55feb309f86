package agent

import (
	"context"
	"fmt"

	"k8s.io/client-go/kubernetes"

	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/nodestatus"
	"github.com/podnet/podnet/dataplane/routing"
)

// goFlannelAnnotations writes flannel's annotations for this node once its
// routes are in place (routed closes), so that nodes still running flannel
// program it as one of theirs: VXLAN on podnet's VNI to the node's
// underlay address (its first InternalIP, where podnet's VXLAN device
// sits) and the VTEP MAC podnet derives from it.
func goFlannelAnnotations(g *app.Group, o Options, client kubernetes.Interface, store *cluster.Store, routed <-chan struct{}) {
	g.Go("flannel annotations", func(ctx context.Context) error {
		select {
		case <-routed:
		case <-ctx.Done():
			return nil
		}
		return retry(ctx, o.Logger, "write flannel's annotations", func() error {
			want, err := flannelAnnotations(o, store.Node(o.NodeName))
			if err != nil {
				return err
			}
			return nodestatus.SetAnnotations(ctx, client, o.NodeName, want)
		})
	})
}

// flannelAnnotations are the annotations flannel reads for node self.
func flannelAnnotations(o Options, self *cluster.Node) (map[string]string, error) {
	if self == nil || len(self.InternalIPs) == 0 {
		return nil, fmt.Errorf("node %q: no InternalIP to publish as flannel's public-ip", o.NodeName)
	}
	ip := self.InternalIPs[0]
	return cluster.FlannelAnnotations(o.VXLANVNI, routing.VTEPMAC(ip), ip), nil
}
