package convert

import (
	"strings"
	"testing"

	networkingv1 "k8s.io/api/networking/v1"
	"sigs.k8s.io/yaml"
)

func TestFromV1NetworkPolicyRefusesWhatTheAPIServerRefuses(t *testing.T) {
	for _, tc := range []struct{ spec, want string }{
		{`{podSelector: {matchExpressions: [{key: a, operator: Has}]}}`, `spec.podSelector: "Has" is not a valid label selector operator`},
		{`{podSelector: {}, policyTypes: [Sideways]}`, `spec.policyTypes[0]: unsupported value "Sideways"`},
		{`{podSelector: {}, policyTypes: [Ingress, Ingress]}`, `spec.policyTypes[1]: duplicate value "Ingress"`},
		{`{podSelector: {}, ingress: [{from: [{}]}]}`, `spec.ingress[0].from[0]: must specify`},
		{`{podSelector: {}, ingress: [{from: [{ipBlock: {cidr: 10.0.0.0/8}, podSelector: {}}]}]}`, `spec.ingress[0].from[0]: ipBlock may not be combined`},
		{`{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/33}}]}]}`, `spec.egress[0].to[0].ipBlock.cidr: "10.0.0.0/33" is not a CIDR`},
		{`{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [11.0.0.0/16]}}]}]}`, `spec.egress[0].to[0].ipBlock.except[0]: 11.0.0.0/16 must be a strict subset of cidr 10.0.0.0/8`},
		{`{podSelector: {}, egress: [{to: [{ipBlock: {cidr: 10.0.0.0/8, except: [10.0.0.0/8]}}]}]}`, `must be a strict subset`},
		{`{podSelector: {}, egress: [{to: [{ipBlock: {cidr: "fd00::/8", except: [10.0.0.0/16]}}]}]}`, `must be a strict subset`},
		{`{podSelector: {}, ingress: [{ports: [{protocol: ICMP}]}]}`, `spec.ingress[0].ports[0].protocol: unsupported value "ICMP"`},
		{`{podSelector: {}, ingress: [{ports: [{port: 70000}]}]}`, `spec.ingress[0].ports[0].port: 70000 is not a port`},
		{`{podSelector: {}, ingress: [{ports: [{port: 80, endPort: 79}]}]}`, `spec.ingress[0].ports[0].endPort: 79 is below port 80`},
		{`{podSelector: {}, ingress: [{ports: [{port: http, endPort: 90}]}]}`, `endPort: may not be set with the named port "http"`},
		{`{podSelector: {}, ingress: [{ports: [{endPort: 90}]}]}`, `endPort: may not be set without port`},
		{`{podSelector: {}, ingress: [{ports: [{port: Not_A_Name}]}]}`, `spec.ingress[0].ports[0].port: "Not_A_Name"`},
	} {
		var np networkingv1.NetworkPolicy
		if err := yaml.Unmarshal([]byte(`{metadata: {namespace: ns, name: bad}, spec: `+tc.spec+`}`), &np); err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		_, err := FromV1NetworkPolicy(&np)
		if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "networkpolicy ns/bad: ") {
			t.Errorf("%s: error %v, want one naming ns/bad and containing %q", tc.spec, err, tc.want)
		}
	}
}

func TestFromV1NetworkPolicyDefaults(t *testing.T) {
	for _, tc := range []struct {
		spec            string
		ingress, egress bool
	}{
		{`{podSelector: {}}`, true, false},
		{`{podSelector: {}, egress: [{}]}`, true, true},
		{`{podSelector: {}, policyTypes: [Egress]}`, false, true},
	} {
		var np networkingv1.NetworkPolicy
		if err := yaml.Unmarshal([]byte(`{metadata: {name: p}, spec: `+tc.spec+`}`), &np); err != nil {
			t.Fatal(err)
		}
		c, err := FromV1NetworkPolicy(&np)
		if err != nil {
			t.Fatalf("%s: %v", tc.spec, err)
		}
		if c.Ingress != tc.ingress || c.Egress != tc.egress || c.Namespace != "default" {
			t.Errorf("%s: ingress %v egress %v namespace %q, want %v %v default", tc.spec, c.Ingress, c.Egress, c.Namespace, tc.ingress, tc.egress)
		}
	}
}
