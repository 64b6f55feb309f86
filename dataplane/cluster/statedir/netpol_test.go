package statedir

import (
	"slices"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/cluster/convert"
)

const policiesYAML = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: good, namespace: a}
spec: {podSelector: {matchLabels: {app: web}}, ingress: [{from: [{namespaceSelector: {}}], ports: [{port: http}]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: badcidr, namespace: a}
spec: {podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: badport, namespace: b}
spec: {podSelector: {}, egress: [{ports: [{port: 90, endPort: 80}]}]}
---
apiVersion: v1
kind: Pod
metadata: {name: web, namespace: a, labels: {app: web}}
spec: {nodeName: node1, containers: [{name: c, ports: [{name: http, containerPort: 8080}]}]}
status: {podIPs: [{ip: 10.244.1.2}]}
`

// TestParseRefusesBadNetworkPolicies: a NetworkPolicy the API server would
// refuse is refused with its file, line and field, and the file's other
// objects are read.
func TestParseRefusesBadNetworkPolicies(t *testing.T) {
	parsed, err := ParseFile("np.yaml", []byte(policiesYAML), convert.Limits{})
	if err != nil {
		t.Fatal(err)
	}
	if got := keys(parsed.Objects); !slices.Equal(got, []string{"NetworkPolicy a/good", "Pod a/web"}) {
		t.Errorf("objects %v, want the good policy and the pod", got)
	}
	want := []struct {
		key   string
		line  int
		field string
	}{
		{"NetworkPolicy a/badcidr", 6, "spec.ingress[0].from[0].ipBlock.except[0]: 11.0.0.0/16 must be a strict subset of cidr 10.0.0.0/8"},
		{"NetworkPolicy b/badport", 11, "spec.egress[0].ports[0].endPort: 80 is below port 90"},
	}
	if len(parsed.Refused) != len(want) {
		t.Fatalf("refused %d objects, want %d: %+v", len(parsed.Refused), len(want), parsed.Refused)
	}
	for i, w := range want {
		r := parsed.Refused[i]
		if got := r.Kind.String() + " " + r.Key.String(); got != w.key || r.Err.Line != w.line || !strings.Contains(r.Err.Error(), w.field) {
			t.Errorf("refusal %d: %s at line %d: %v; want %s at line %d naming %q", i, got, r.Err.Line, r.Err, w.key, w.line, w.field)
		}
	}
	for _, o := range parsed.Objects {
		if p, ok := o.(*cluster.Pod); ok && (p.Labels["app"] != "web" || len(p.Ports) != 1 || p.Ports[0].Name != "http") {
			t.Errorf("pod %+v: labels and named ports lost", p)
		}
	}
}
