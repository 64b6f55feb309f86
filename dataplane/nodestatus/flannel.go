package nodestatus

import (
	"context"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// SetAnnotations makes the Node's annotations hold want (flannel's, for a
// podnet node while the cluster migrates), with one merge patch of those
// keys only, and nothing when they already do.
func SetAnnotations(ctx context.Context, client kubernetes.Interface, nodeName string, want map[string]string) error {
	n, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", nodeName, err)
	}
	diff := map[string]string{}
	for k, v := range want {
		if n.Annotations[k] != v {
			diff[k] = v
		}
	}
	if len(diff) == 0 {
		return nil
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": diff}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().Patch(ctx, nodeName, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("annotate node %s: %w", nodeName, err)
	}
	return nil
}
