package nodestatus

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestSetAnnotations: the wanted annotations are merged in beside the
// Node's others, and a second call with nothing to change sends no patch.
func TestSetAnnotations(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", Annotations: map[string]string{"other": "kept"}}})
	want := map[string]string{"flannel.alpha.coreos.com/public-ip": "192.168.10.11", "flannel.alpha.coreos.com/kube-subnet-manager": "true"}
	ctx := context.Background()
	if err := SetAnnotations(ctx, c, "n1", want); err != nil {
		t.Fatal(err)
	}
	n, _ := c.CoreV1().Nodes().Get(ctx, "n1", metav1.GetOptions{})
	if n.Annotations["other"] != "kept" || n.Annotations["flannel.alpha.coreos.com/public-ip"] != "192.168.10.11" || n.Annotations["flannel.alpha.coreos.com/kube-subnet-manager"] != "true" {
		t.Errorf("annotations %v", n.Annotations)
	}
	patches := func() int {
		k := 0
		for _, a := range c.Actions() {
			if _, ok := a.(k8stesting.PatchAction); ok {
				k++
			}
		}
		return k
	}
	before := patches()
	if err := SetAnnotations(ctx, c, "n1", want); err != nil {
		t.Fatal(err)
	}
	if p := patches(); p != before {
		t.Errorf("%d patches for nothing to change", p-before)
	}
	if err := SetAnnotations(ctx, c, "gone", want); err == nil {
		t.Error("no error for a missing Node")
	}
}
