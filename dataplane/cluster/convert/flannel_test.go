package convert

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/dataplane/cluster"
)

// TestNodeFlannelAnnotations: a Node flannel manages carries what its
// annotations say into the compact Node; one without them has none.
func TestNodeFlannelAnnotations(t *testing.T) {
	n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n2", Annotations: map[string]string{
		cluster.FlannelSubnetManaged: "true", cluster.FlannelBackendType: "vxlan",
		cluster.FlannelBackendData: `{"VNI":1,"VtepMAC":"a6:1f:3c:00:00:02"}`, cluster.FlannelPublicIP: "192.168.10.12",
	}}}
	out, err := FromV1Node(n)
	if err != nil {
		t.Fatal(err)
	}
	if f := out.Flannel; f == nil || f.Err != "" || f.VTEPMAC.String() != "a6:1f:3c:00:00:02" || f.PublicIP.String() != "192.168.10.12" {
		t.Errorf("Flannel = %+v", out.Flannel)
	}
	n.Annotations = nil
	if out, _ := FromV1Node(n); out.Flannel != nil {
		t.Errorf("Flannel = %+v without annotations", out.Flannel)
	}
}
