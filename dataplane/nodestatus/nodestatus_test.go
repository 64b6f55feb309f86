package nodestatus

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

func condition(t *testing.T, c *fake.Clientset, name string, typ corev1.NodeConditionType) *corev1.NodeCondition {
	t.Helper()
	n, err := c.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == typ {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

func TestSetNetworkAvailable(t *testing.T) {
	old := metav1.NewTime(time.Now().Add(-time.Hour).Truncate(time.Second))
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "n1"},
		Status: corev1.NodeStatus{Conditions: []corev1.NodeCondition{
			{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: old},
			{Type: corev1.NodeNetworkUnavailable, Status: corev1.ConditionTrue, Reason: "NoRouteCreated", LastTransitionTime: old},
		}},
	}
	c := fake.NewClientset(node)
	ctx := context.Background()
	if err := SetNetworkAvailable(ctx, c, "n1"); err != nil {
		t.Fatal(err)
	}
	nu := condition(t, c, "n1", corev1.NodeNetworkUnavailable)
	if nu == nil || nu.Status != corev1.ConditionFalse || nu.Reason != Reason || !nu.LastTransitionTime.After(old.Time) {
		t.Fatalf("NetworkUnavailable after the patch: %+v", nu)
	}
	if r := condition(t, c, "n1", corev1.NodeReady); r == nil || r.Status != corev1.ConditionTrue || r.Reason != "KubeletReady" {
		t.Errorf("the Ready condition was changed: %+v", r)
	}

	// Already False: no second patch.
	c.ClearActions()
	if err := SetNetworkAvailable(ctx, c, "n1"); err != nil {
		t.Fatal(err)
	}
	for _, a := range c.Actions() {
		if _, ok := a.(k8stesting.PatchAction); ok {
			t.Errorf("patched a node whose condition was already False: %v", a)
		}
	}
}

func TestSetNetworkAvailableAddsMissingCondition(t *testing.T) {
	c := fake.NewClientset(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1"}})
	if err := SetNetworkAvailable(context.Background(), c, "n1"); err != nil {
		t.Fatal(err)
	}
	if nu := condition(t, c, "n1", corev1.NodeNetworkUnavailable); nu == nil || nu.Status != corev1.ConditionFalse {
		t.Fatalf("NetworkUnavailable: %+v, want False", nu)
	}
}

func TestSetNetworkAvailableMissingNode(t *testing.T) {
	if err := SetNetworkAvailable(context.Background(), fake.NewClientset(), "nope"); err == nil {
		t.Fatal("no error for a node that does not exist")
	}
}
