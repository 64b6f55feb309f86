package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/policy"
)

func TestStatusPrintsAPodsPolicies(t *testing.T) {
	st := &policy.Status{Pods: []policy.PodStatus{{
		Pod:     "red/a",
		Ingress: []policy.PolicyStatus{{Policy: "red/deny-in", Allows: []string{}}, {Policy: "red/from-green", Allows: []string{"from all pods of namespaces team=green on TCP/8080"}}},
	}}}
	var out, errs bytes.Buffer
	if code := printPodPolicies(&out, &errs, st, "red/a", false); code != 0 {
		t.Fatalf("exit %d: %s", code, errs.String())
	}
	want := `  red/a
    ingress: red/deny-in allows nothing
    ingress: red/from-green allows from all pods of namespaces team=green on TCP/8080
    egress: not isolated (everything allowed)
`
	if out.String() != want {
		t.Errorf("printed\n%s\nwant\n%s", out.String(), want)
	}
	out.Reset()
	printPolicies(&out, st)
	if !strings.HasPrefix(out.String(), "\nNetworkPolicy (1 pods selected):\n  red/a\n") {
		t.Errorf("section\n%s", out.String())
	}
	if code := printPodPolicies(&out, &errs, nil, "red/a", false); code != 1 || !strings.Contains(errs.String(), "--network-policy") {
		t.Errorf("without the controller: exit %d, %q", code, errs.String())
	}
}
