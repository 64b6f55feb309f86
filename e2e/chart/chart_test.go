package chart

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/e2e/realnode"
)

const chartDir = "../../deploy/helm/podnet"

// objects is a manifest stream parsed into objects keyed by
// apiVersion/kind/namespace/name, each normalised: a container's command
// keeps its binary and positional arguments in order, then its flags
// sorted, each once with the last value given (as proxyd, dnsd and podnet
// read them), so that kustomize's appended overrides and the chart's
// single flags compare as what the binaries see.
type objects map[string]map[string]any

func parse(t *testing.T, what, stream string) objects {
	t.Helper()
	out := objects{}
	dec := utilyaml.NewYAMLOrJSONDecoder(strings.NewReader(stream), 4096)
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return out
		} else if err != nil {
			t.Fatalf("%s: %v\n%s", what, err, stream)
		}
		if doc == nil {
			continue
		}
		md, _ := doc["metadata"].(map[string]any)
		key := fmt.Sprintf("%v/%v/%v/%v", doc["apiVersion"], doc["kind"], md["namespace"], md["name"])
		if _, dup := out[key]; dup {
			t.Fatalf("%s: %s twice", what, key)
		}
		normalise(doc)
		out[key] = doc
	}
}

// normalise rewrites every container command found in doc (any depth).
func normalise(v any) {
	switch v := v.(type) {
	case map[string]any:
		for _, k := range []string{"containers", "initContainers"} {
			cs, _ := v[k].([]any)
			for _, c := range cs {
				if c, ok := c.(map[string]any); ok {
					if cmd, ok := c["command"].([]any); ok {
						c["command"] = normaliseCommand(cmd)
					}
				}
			}
		}
		// Lists whose order means nothing, by name: kustomize's strategic
		// merge puts a patch's entries first, the chart last.
		for _, k := range []string{"volumes", "volumeMounts", "env"} {
			if l, ok := v[k].([]any); ok {
				sort.SliceStable(l, func(i, j int) bool { return fmt.Sprint(name(l[i])) < fmt.Sprint(name(l[j])) })
			}
		}
		for _, x := range v {
			normalise(x)
		}
	case []any:
		for _, x := range v {
			normalise(x)
		}
	}
}

func name(v any) any {
	m, _ := v.(map[string]any)
	return m["name"]
}

func normaliseCommand(cmd []any) []any {
	var head []any
	flags := map[string]string{}
	for i, a := range cmd {
		s, _ := a.(string)
		if i == 0 || !strings.HasPrefix(s, "--") {
			head = append(head, a)
			continue
		}
		name, value, ok := strings.Cut(strings.TrimPrefix(s, "--"), "=")
		if !ok {
			value = "true"
		}
		flags[name] = value
	}
	names := make([]string, 0, len(flags))
	for n := range flags {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		head = append(head, "--"+n+"="+flags[n])
	}
	return head
}

// kustomize builds dir (relative to the repository's deploy/) with
// kubectl kustomize, as README's `kubectl apply -k` does; extra, if not
// empty, is a kustomization written beside it in a temporary directory,
// with DEPLOY standing for deploy/'s path relative to it.
func kustomize(t *testing.T, kubectl, dir, extra string) string {
	t.Helper()
	deploy, err := filepath.Abs("../../deploy")
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(deploy, dir)
	if extra != "" {
		tmp := t.TempDir()
		rel, err := filepath.Rel(tmp, deploy)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, "kustomization.yaml"), []byte(strings.ReplaceAll(extra, "DEPLOY", rel)), 0o644); err != nil {
			t.Fatal(err)
		}
		target = tmp
	}
	var stderr bytes.Buffer
	cmd := exec.Command(kubectl, "kustomize", target)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s\n%s", dir, err, stderr.String(), extra)
	}
	return string(out)
}

func render(t *testing.T, values map[string]any) string {
	t.Helper()
	out, err := Render(chartDir, values)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// compare reports what differs between the chart's objects and
// kustomize's, "" if nothing.
func compare(chart, kust objects) string {
	return cmp.Diff(kust, chart)
}

// Flags and images that TestChartMatchesKustomize's non-default cases set
// on both sides.
const (
	otherImage = "registry.example/podnet/podnet"
	otherTag   = "v9.8.7-test"
	dualCIDR   = "10.32.0.0/12,fd00:10:32::/56"
	otherDNS   = "10.100.0.10"
)

// nonDefaults is a kustomization over DEPLOY/<base> (components after it)
// setting what the chart's non-default values set: image, dual-stack
// cluster CIDR, DNS Service address, NetworkPolicy off. The flags are
// appended, the last of a repeated flag winning as in the components.
func nonDefaults(base string, components ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - DEPLOY/%s\n", base)
	if len(components) > 0 {
		b.WriteString("components:\n")
		for _, c := range components {
			fmt.Fprintf(&b, "  - DEPLOY/components/%s\n", c)
		}
	}
	fmt.Fprintf(&b, `images:
  - name: ghcr.io/podnet/podnet
    newName: %s
    newTag: %s
patches:
  - target: {kind: DaemonSet}
    patch: |-
      - {op: test, path: /spec/template/spec/initContainers/0/name, value: sysctls}
      - {op: add, path: /spec/template/spec/initContainers/0/command/-, value: "--cluster-cidr=%[3]s"}
      - {op: test, path: /spec/template/spec/containers/0/name, value: proxyd}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: "--cluster-cidr=%[3]s"}
      - {op: add, path: /spec/template/spec/containers/0/command/-, value: --network-policy=false}
  - target: {kind: Service, name: kube-dns}
    patch: |-
      - {op: replace, path: /spec/clusterIP, value: %s}
`, otherImage, otherTag, dualCIDR, otherDNS)
	return b.String()
}

func nonDefaultValues(v map[string]any) map[string]any {
	v["image"] = map[string]any{"repository": otherImage, "tag": otherTag}
	cidr := strings.Split(dualCIDR, ",")
	v["clusterCIDR"] = map[string]any{"ipv4": cidr[0], "ipv6": cidr[1]}
	v["dns"] = map[string]any{"serviceIP": otherDNS}
	v["networkPolicy"] = false
	return v
}

// withComponent is a kustomization of DEPLOY/<base> with components.
func withComponents(base string, components ...string) string {
	s := fmt.Sprintf("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - DEPLOY/%s\ncomponents:\n", base)
	for _, c := range components {
		s += fmt.Sprintf("  - DEPLOY/components/%s\n", c)
	}
	return s
}

type matchCase struct {
	name   string
	values map[string]any
	dir    string // under deploy/, when extra is ""
	extra  string // a kustomization (nonDefaults, withComponents)
}

func matchCases() []matchCase {
	cases := []matchCase{
		{"whole/iptables", map[string]any{}, ".", ""},
		{"whole/ebpf", map[string]any{"proxyMode": "ebpf"}, "ebpf", ""},
		{"whole/nftables", map[string]any{"proxyMode": "nftables"}, "nftables", ""},
		// beside programs nothing whatever the proxy mode to come
		{"beside/iptables", map[string]any{"migrationStage": "beside"}, "migrate/1-beside", ""},
		{"beside/ebpf", map[string]any{"migrationStage": "beside", "proxyMode": "ebpf"}, "migrate/1-beside", ""},
		{"services/iptables", map[string]any{"migrationStage": "services"}, "migrate/2-services", ""},
		{"dns/iptables", map[string]any{"migrationStage": "dns"}, "migrate/3-dns", ""},
		{"pod-network/iptables", map[string]any{"migrationStage": "pod-network"}, "migrate/4-pod-network", ""},
		{"whole/non-default values", nonDefaultValues(map[string]any{}), "", nonDefaults(".")},
		{"dns/nftables/non-default values", nonDefaultValues(map[string]any{"migrationStage": "dns", "proxyMode": "nftables"}), "", nonDefaults("migrate/3-dns", "nftables")},
		{"pod-network/non-default values", nonDefaultValues(map[string]any{"migrationStage": "pod-network"}), "", nonDefaults("migrate/4-pod-network")},
	}
	for _, stage := range []string{"services", "dns"} {
		dir := map[string]string{"services": "migrate/2-services", "dns": "migrate/3-dns"}[stage]
		for _, mode := range []string{"ebpf", "nftables"} {
			cases = append(cases, matchCase{stage + "/" + mode, map[string]any{"migrationStage": stage, "proxyMode": mode}, "", withComponents(dir, mode)})
		}
	}
	return cases
}

// TestChartMatchesKustomize renders the Helm chart (Helm's Go packages, no
// network) for each proxy mode and migration stage and compares its
// objects with what kubectl kustomize builds from deploy/'s matching
// variant or stage overlay: the same objects, field for field, and the
// same command lines as the binaries read them. Stages services and dns in
// ebpf and nftables mode have no overlay of their own in deploy/; their
// kustomize side is the stage overlay with the mode's component, as a
// user's kustomization would say it. Non-default values (image, dual-stack
// cluster CIDR, DNS address, NetworkPolicy off) are compared with the
// patches a kustomize user would write for them.
func TestChartMatchesKustomize(t *testing.T) {
	bins, err := realnode.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range matchCases() {
		t.Run(c.name, func(t *testing.T) {
			k := parse(t, "kustomize", kustomize(t, bins.Kubectl, c.dir, c.extra))
			h := parse(t, "chart", render(t, c.values))
			if len(k) < 5 {
				t.Fatalf("kustomize built only %d objects", len(k))
			}
			if d := compare(h, k); d != "" {
				t.Errorf("the chart (values %v) and kustomize differ (-kustomize +chart):\n%s", c.values, d)
			}
			checkSelectorsDisjoint(t, h)
		})
	}
}

// checkSelectorsDisjoint fails when a DaemonSet's selector matches the
// pods of another one (stage pod-network renders two): both would claim
// them.
func checkSelectorsDisjoint(t *testing.T, objs objects) {
	t.Helper()
	type ds struct{ selector, podLabels map[string]any }
	sets := map[string]ds{}
	for key, o := range objs {
		if o["kind"] != "DaemonSet" {
			continue
		}
		spec, _ := o["spec"].(map[string]any)
		sel, _ := spec["selector"].(map[string]any)
		tmpl, _ := spec["template"].(map[string]any)
		md, _ := tmpl["metadata"].(map[string]any)
		ml, _ := sel["matchLabels"].(map[string]any)
		pl, _ := md["labels"].(map[string]any)
		if len(ml) == 0 || len(sel) != 1 {
			t.Fatalf("%s: selector %v: want matchLabels alone", key, sel)
		}
		sets[key] = ds{ml, pl}
	}
	matches := func(sel, labels map[string]any) bool {
		for k, v := range sel {
			if labels[k] != v {
				return false
			}
		}
		return true
	}
	for a, da := range sets {
		if !matches(da.selector, da.podLabels) {
			t.Errorf("%s does not select its own pods: %v, %v", a, da.selector, da.podLabels)
		}
		for b, db := range sets {
			if a != b && matches(da.selector, db.podLabels) {
				t.Errorf("%s selects %s's pods: %v matches %v", a, b, da.selector, db.podLabels)
			}
		}
	}
}

// TestChartComparisonCatchesDrift: a change on either side is reported.
// Each mutation below is one a careless edit of the chart or of deploy/
// would make; compare must see each, while the base's flag overridden by
// a later one (kustomize's way) is no difference.
func TestChartComparisonCatchesDrift(t *testing.T) {
	bins, err := realnode.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	kust := kustomize(t, bins.Kubectl, "migrate/4-pod-network", "")
	chart := render(t, map[string]any{"migrationStage": "pod-network"})
	if d := compare(parse(t, "chart", chart), parse(t, "kustomize", kust)); d != "" {
		t.Fatalf("no mutation yet, and they differ:\n%s", d)
	}
	for _, m := range []struct {
		name   string
		old    string
		new    string
		differ bool
	}{
		{"a flag's value", "--drain-max=20s", "--drain-max=30s", true},
		{"a flag dropped", "        - --flannel-annotations\n", "", true},
		{"a flag added", "        - --backend=auto\n", "        - --backend=auto\n        - --masquerade-all\n", true},
		{"an overridden flag", "--proxy-mode=iptables\n        - --healthz-bind-address=0.0.0.0:10256\n        - --metrics-bind-address=127.0.0.1:10249\n        - --pod-network=none",
			"--proxy-mode=iptables\n        - --healthz-bind-address=0.0.0.0:10256\n        - --metrics-bind-address=127.0.0.1:10249\n        - --pod-network=podnet\n        - --pod-network=none", false},
		{"a label", "podnet.io/stage: on-flannel", "podnet.io/stage: flannel", true},
		{"the DNS address", "clusterIP: 10.96.0.10", "clusterIP: 10.96.0.11", true},
		{"a volume", "mountPath: /run/xtables.lock", "mountPath: /run/xtables.lock2", true},
		{"an object renamed", "name: podnet-dns\n  namespace: kube-system\nspec:\n  maxUnavailable", "name: podnet-dns2\n  namespace: kube-system\nspec:\n  maxUnavailable", true},
	} {
		if !strings.Contains(kust, m.old) {
			t.Fatalf("%s: kustomize's output has no %q", m.name, m.old)
		}
		mutated := strings.Replace(kust, m.old, m.new, 1)
		d := compare(parse(t, "chart", chart), parse(t, m.name, mutated))
		if (d != "") != m.differ {
			t.Errorf("%s (kustomize side): differ %v, want %v\n%s", m.name, d != "", m.differ, d)
		}
	}
	// The chart side: one value changed is one difference.
	for _, v := range []map[string]any{
		{"migrationStage": "dns"},
		{"migrationStage": "pod-network", "networkPolicy": false},
		{"migrationStage": "pod-network", "dns": map[string]any{"serviceIP": "10.96.0.11"}},
		{"migrationStage": "pod-network", "clusterCIDR": map[string]any{"ipv6": "fd00::/56"}},
	} {
		if compare(parse(t, "chart", render(t, v)), parse(t, "kustomize", kust)) == "" {
			t.Errorf("chart with %v renders as deploy/migrate/4-pod-network", v)
		}
	}
}

// TestChartRefusesBadValues: values the chart cannot honour fail the
// render, naming the value.
func TestChartRefusesBadValues(t *testing.T) {
	for _, c := range []struct {
		values map[string]any
		want   string
	}{
		{map[string]any{"proxyMode": "ipvs"}, `proxyMode "ipvs"`},
		{map[string]any{"migrationStage": "2-services"}, `migrationStage "2-services"`},
		{map[string]any{"migrationStage": "pod-network", "proxyMode": "ebpf"}, `pod-network runs proxyMode iptables only`},
		{map[string]any{"clusterCIDR": map[string]any{"ipv4": ""}}, `clusterCIDR: set ipv4, ipv6 or both`},
	} {
		_, err := Render(chartDir, c.values)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("values %v: %v, want an error naming %q", c.values, err, c.want)
		}
	}
}

// TestChartVersionIsTheRelease: the chart's appVersion is the release the
// Makefile builds and deploy/ installs.
func TestChartVersionIsTheRelease(t *testing.T) {
	mk, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	var release string
	for _, l := range strings.Split(string(mk), "\n") {
		if v, ok := strings.CutPrefix(l, "RELEASE  := "); ok {
			release = strings.TrimSpace(v)
		}
	}
	raw, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	if release == "" || c.AppVersion != release {
		t.Errorf("Chart.yaml appVersion %q, Makefile RELEASE %q", c.AppVersion, release)
	}
}
