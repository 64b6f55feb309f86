// Package nodestatus reports the node's network to the API server the way
// network plugins do: the Node condition NetworkUnavailable=False once the
// node's routes are in place. Cloud providers and kubeadm set it True on
// new nodes; while it is True the scheduler keeps pods off the node.
package nodestatus

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// Reason is the condition's reason when podnet set it.
const Reason = "PodnetRoutesCreated"

// SetNetworkAvailable sets the node's NetworkUnavailable condition to False.
// A condition that is already False is left alone, so calling this after
// every sync costs one GET and keeps the transition time meaningful.
func SetNetworkAvailable(ctx context.Context, client kubernetes.Interface, nodeName string) error {
	node, err := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		return fmt.Errorf("get node %s: %w", nodeName, err)
	}
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeNetworkUnavailable && c.Status == corev1.ConditionFalse {
			return nil
		}
	}
	now := metav1.NewTime(time.Now())
	// A strategic merge patch of status.conditions merges by type: the
	// kubelet's conditions stay as they are.
	patch, err := json.Marshal(map[string]any{"status": map[string]any{
		"conditions": []corev1.NodeCondition{{
			Type:               corev1.NodeNetworkUnavailable,
			Status:             corev1.ConditionFalse,
			Reason:             Reason,
			Message:            "podnet has set up the routes to the node's pods",
			LastTransitionTime: now,
			LastHeartbeatTime:  now,
		}},
	}})
	if err != nil {
		return err
	}
	if _, err := client.CoreV1().Nodes().PatchStatus(ctx, nodeName, patch); err != nil {
		return fmt.Errorf("set NetworkUnavailable=False on node %s: %w", nodeName, err)
	}
	return nil
}
