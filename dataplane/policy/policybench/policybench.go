// Package policybench is the NetworkPolicy benchmarks' cluster (issue 24):
// 5,000 pods in 100 namespaces over 50 nodes and 1,000 policies, as API
// objects, for the benchmarks of dataplane/policy and for proxyd fed from
// the state directory in e2e.
package policybench

import (
	"fmt"
	"net/netip"
	"strings"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// The world's size.
const (
	Pods       = 5000
	Namespaces = 100
	Nodes      = 50
	// PoliciesPerNamespace: a default deny and nine allows.
	PoliciesPerNamespace = 10
)

// Pod is pod i as a ReplicaSet makes it: three labels, one container with
// a named port http (8080), an address per family (10.244.i>>8.i&255 and
// fd00:10:244::i), on node i%50 in namespace ns i%100. Each namespace's 50
// pods are apps 0 to 49, so each of the nine allows of a namespace selects
// one of its pods: every policy of the world selects a pod.
func Pod(i int) *v1.Pod {
	return &v1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: fmt.Sprintf("ns%d", i%Namespaces), Name: fmt.Sprintf("app%d-7d4b9c8f6-%05d", appOf(i), i),
			Labels: map[string]string{"app": fmt.Sprintf("app%d", appOf(i)), "pod-template-hash": "7d4b9c8f6", "tier": []string{"web", "db"}[i%2]}},
		Spec: v1.PodSpec{NodeName: NodeOf(i), Containers: []v1.Container{{Name: "main", Image: "registry.example/app:1",
			Ports: []v1.ContainerPort{{Name: "http", ContainerPort: 8080, Protocol: v1.ProtocolTCP}}}}},
		Status: v1.PodStatus{PodIPs: []v1.PodIP{
			{IP: netip.AddrFrom4([4]byte{10, 244, byte(i >> 8), byte(i)}).String()},
			{IP: netip.AddrFrom16([16]byte{0xfd, 0, 0x10, 0, 0x2, 0x44, 0, 0, 0, 0, 0, 0, 0, 0, byte(i >> 8), byte(i)}).String()}}},
	}
}

func appOf(i int) int { return i / Namespaces % 50 }

// NodeOf is the node pod i runs on.
func NodeOf(i int) string { return fmt.Sprintf("node%d", i%Nodes) }

// Namespace n, labelled team t<n%10>.
func Namespace(n int) *v1.Namespace {
	return &v1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"},
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("ns%d", n), Labels: map[string]string{"team": fmt.Sprintf("t%d", n%10)}}}
}

// PolicyDocs are the 1,000 policies, one YAML document each: per namespace
// a default deny (ingress and egress), and nine that open ingress from
// the web tier of the namespaces of one team on the named port http and
// ports 9000-9100, and egress to one app of the namespace.
func PolicyDocs() []string {
	var docs []string
	for n := range Namespaces {
		docs = append(docs, fmt.Sprintf("apiVersion: networking.k8s.io/v1\nkind: NetworkPolicy\nmetadata: {namespace: ns%d, name: deny}\nspec: {podSelector: {}, policyTypes: [Ingress, Egress]}", n))
		for k := range PoliciesPerNamespace - 1 {
			docs = append(docs, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {namespace: ns%d, name: allow%d}
spec:
  podSelector: {matchLabels: {app: app%d}}
  ingress: [{from: [{namespaceSelector: {matchLabels: {team: t%d}}, podSelector: {matchLabels: {tier: web}}}], ports: [{port: http}, {port: 9000, endPort: 9100}]}]
  egress: [{to: [{podSelector: {matchLabels: {app: app%d}}}]}]`, n, k, (n+k)%50, k, (n+k+1)%50))
		}
	}
	return docs
}

// StateYAML is the whole world as one multi-document YAML file of the
// state directory: the namespaces, the pods and the policies.
func StateYAML() (string, error) {
	var docs []string
	add := func(o any) error {
		b, err := yaml.Marshal(o)
		if err == nil {
			docs = append(docs, string(b))
		}
		return err
	}
	for n := range Namespaces {
		if err := add(Namespace(n)); err != nil {
			return "", err
		}
	}
	for i := range Pods {
		if err := add(Pod(i)); err != nil {
			return "", err
		}
	}
	docs = append(docs, PolicyDocs()...)
	return strings.Join(docs, "\n---\n"), nil
}
