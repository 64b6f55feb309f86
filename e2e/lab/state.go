package lab

import (
	"fmt"
	"time"

	"sigs.k8s.io/yaml"
)

// writeClusterState writes what a control plane would hold before any
// workload exists: the Node objects and the two namespaces every cluster has.
// The objects are plain maps so the files read like `kubectl get -o yaml`
// output, without the empty fields typed structs would add.
func (l *Lab) writeClusterState() error {
	now := time.Now().UTC().Format(time.RFC3339)
	var nodes []any
	for _, n := range l.Nodes {
		var cidrs []string
		for _, p := range n.PodCIDRs() {
			cidrs = append(cidrs, p.String())
		}
		addrs := []any{}
		for _, a := range n.InternalIPs() {
			addrs = append(addrs, map[string]any{"type": "InternalIP", "address": a.String()})
		}
		addrs = append(addrs, map[string]any{"type": "Hostname", "address": n.Name})
		nodes = append(nodes, map[string]any{
			"apiVersion": "v1",
			"kind":       "Node",
			"metadata": map[string]any{
				"name":              n.Name,
				"creationTimestamp": now,
				"labels": map[string]any{
					"kubernetes.io/hostname":      n.Name,
					"kubernetes.io/os":            "linux",
					"topology.kubernetes.io/zone": n.Zone,
				},
			},
			"spec": map[string]any{
				"podCIDR":  cidrs[0],
				"podCIDRs": cidrs,
			},
			"status": map[string]any{
				"addresses": addrs,
				"conditions": []any{
					map[string]any{"type": "Ready", "status": "True", "reason": "KubeletReady", "lastTransitionTime": now},
				},
			},
		})
	}
	if err := l.writeList("nodes.yaml", nodes); err != nil {
		return err
	}
	var namespaces []any
	for _, name := range []string{"default", "kube-system"} {
		namespaces = append(namespaces, map[string]any{
			"apiVersion": "v1",
			"kind":       "Namespace",
			"metadata": map[string]any{
				"name":              name,
				"creationTimestamp": now,
				"labels":            map[string]any{"kubernetes.io/metadata.name": name},
			},
			"status": map[string]any{"phase": "Active"},
		})
	}
	return l.writeList("namespaces.yaml", namespaces)
}

// writeList writes items as a `kind: List`, the form `kubectl get -o yaml`
// prints for several objects.
func (l *Lab) writeList(file string, items []any) error {
	data, err := yaml.Marshal(map[string]any{
		"apiVersion": "v1",
		"kind":       "List",
		"metadata":   map[string]any{"resourceVersion": ""},
		"items":      items,
	})
	if err != nil {
		return fmt.Errorf("encode %s: %w", file, err)
	}
	return l.WriteState(file, string(data))
}
