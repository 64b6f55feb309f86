package e2e

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/podnet/podnet/e2e/realnode"
)

// podnetImageRepo is the image every podnet container runs.
const podnetImageRepo = "ghcr.io/podnet/podnet"

// makefileRelease is RELEASE in ../Makefile: the tag make image writes.
func makefileRelease(t *testing.T) string {
	t.Helper()
	mk, err := os.ReadFile("../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^RELEASE\s*:?=\s*(\S+)\s*$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("../Makefile sets no RELEASE")
	}
	// make image tags what it builds with the release.
	var imageTag string
	if tag := regexp.MustCompile(`(?m)^IMAGE_TAG\s*\??=\s*(\S+)\s*$`).FindSubmatch(mk); tag != nil {
		imageTag = string(tag[1])
	}
	if want := podnetImageRepo + ":$(RELEASE)"; imageTag != want {
		t.Errorf("../Makefile: IMAGE_TAG is %q, want %q", imageTag, want)
	}
	return string(m[1])
}

// yamlDocs decodes every document of every YAML file under ../deploy
// (overlays too), keyed by the file's path. The Helm chart's templates
// are not YAML until rendered: e2e/chart compares what they render with
// these manifests.
func yamlDocs(t *testing.T) map[string][]map[string]any {
	t.Helper()
	docs := map[string][]map[string]any{}
	err := filepath.WalkDir("../deploy", func(path string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() && path == filepath.Join("..", "deploy", "helm") {
			return filepath.SkipDir
		}
		if err != nil || d.IsDir() || (!strings.HasSuffix(path, ".yaml") && !strings.HasSuffix(path, ".yml")) {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return err
			}
			if len(doc) > 0 {
				docs[path] = append(docs[path], doc)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

// imageRefs returns every value of an "image" key anywhere in v.
func imageRefs(v any) []string {
	var out []string
	switch v := v.(type) {
	case map[string]any:
		for k, x := range v {
			if s, ok := x.(string); ok && k == "image" {
				out = append(out, s)
			} else {
				out = append(out, imageRefs(x)...)
			}
		}
	case []any:
		for _, x := range v {
			out = append(out, imageRefs(x)...)
		}
	}
	return out
}

// splitTag splits "repo:tag" (a registry port is not a tag); a digest
// counts as pinned.
func splitTag(ref string) (repo, tag string) {
	if i := strings.Index(ref, "@"); i >= 0 {
		return ref[:i], ref[i:]
	}
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		return ref[:i], ref[i+1:]
	}
	return ref, ""
}

// Every image deploy/ names is pinned (a tag other than latest, or a
// digest), and podnet's own is the release make image builds, in the
// manifests and in every kustomization's images override alike.
func TestDeployImagesPinnedToRelease(t *testing.T) {
	release := makefileRelease(t)
	var podnetRefs int
	for path, docs := range yamlDocs(t) {
		for _, doc := range docs {
			var refs []string
			if doc["kind"] == "Kustomization" {
				imgs, _ := doc["images"].([]any)
				for _, x := range imgs {
					img, _ := x.(map[string]any)
					name, _ := img["name"].(string)
					if n, ok := img["newName"].(string); ok {
						name = n
					}
					switch {
					case img["digest"] != nil:
						refs = append(refs, name+"@"+img["digest"].(string))
					case img["newTag"] != nil:
						refs = append(refs, name+":"+img["newTag"].(string))
					default:
						refs = append(refs, name)
					}
				}
			} else {
				refs = imageRefs(doc)
			}
			for _, ref := range refs {
				repo, tag := splitTag(ref)
				switch {
				case tag == "" || tag == "latest":
					t.Errorf("%s: image %q is not pinned to a release", path, ref)
				case repo == podnetImageRepo:
					podnetRefs++
					if tag != release {
						t.Errorf("%s: image %q, but the Makefile's RELEASE (make image) is %s", path, ref, release)
					}
				}
			}
		}
	}
	if podnetRefs < 4 {
		t.Errorf("found %d references to %s in deploy/, want the kustomization's and the four containers'", podnetRefs, podnetImageRepo)
	}
	for _, path := range []string{"../README.md", "../Makefile"} {
		text, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(text, []byte(podnetImageRepo+":latest")) {
			t.Errorf("%s still names %s:latest", path, podnetImageRepo)
		}
	}
}

// podSpecs returns the pod template spec of every DaemonSet and Deployment
// of deploy/*.yaml by "Kind name".
func podSpecs(t *testing.T) map[string]map[string]any {
	t.Helper()
	objs, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]map[string]any{}
	for _, u := range objs {
		if k := u.GetKind(); k == "DaemonSet" || k == "Deployment" {
			spec, _, _ := unstructured.NestedMap(u.Object, "spec", "template", "spec")
			out[k+" "+u.GetName()] = spec
		}
	}
	return out
}

// The workloads run only on Linux nodes, and the DaemonSet's only
// privileged container is the init container that sets the sysctls:
// proxyd itself runs with the read-only /proc/sys of an unprivileged
// container.
func TestDeployPodSpecs(t *testing.T) {
	specs := podSpecs(t)
	for _, name := range []string{"DaemonSet podnet-node", "Deployment podnet-dns"} {
		spec, ok := specs[name]
		if !ok {
			t.Errorf("deploy/ has no %s", name)
			continue
		}
		if sel, _, _ := unstructured.NestedString(spec, "nodeSelector", "kubernetes.io/os"); sel != "linux" {
			t.Errorf("%s: nodeSelector kubernetes.io/os is %q, want linux", name, sel)
		}
	}
	var privileged []string
	for _, field := range []string{"initContainers", "containers"} {
		cs, _, _ := unstructured.NestedSlice(specs["DaemonSet podnet-node"], field)
		for _, c := range cs {
			c := c.(map[string]any)
			if p, _, _ := unstructured.NestedBool(c, "securityContext", "privileged"); p {
				cmd, _, _ := unstructured.NestedStringSlice(c, "command")
				privileged = append(privileged, field+": "+strings.Join(cmd, " "))
			}
		}
	}
	if want := []string{"initContainers: /usr/local/bin/proxyd init --cluster-cidr=10.244.0.0/16"}; !slices.Equal(privileged, want) {
		t.Errorf("privileged containers of podnet-node: %q, want only %q", privileged, want)
	}
	checkInitClusterCIDR(t, "deploy/", specs["DaemonSet podnet-node"])
}

// checkInitClusterCIDR: the sysctls init container (proxyd init) is given
// proxyd's --cluster-cidr, so a cluster made dual-stack or IPv6-only in
// one place gets IPv6 forwarding too, not only proxyd's check failing.
func checkInitClusterCIDR(t *testing.T, where string, spec map[string]any) {
	t.Helper()
	flag := func(field, name string) (cidr string, found bool) {
		cs, _, _ := unstructured.NestedSlice(spec, field)
		for _, c := range cs {
			c := c.(map[string]any)
			if n, _, _ := unstructured.NestedString(c, "name"); n != name {
				continue
			}
			cmd, _, _ := unstructured.NestedStringSlice(c, "command")
			for _, a := range cmd {
				if v, ok := strings.CutPrefix(a, "--cluster-cidr="); ok {
					return v, true
				}
			}
			return "", true
		}
		return "", false
	}
	initCIDR, okInit := flag("initContainers", "sysctls")
	proxydCIDR, okProxyd := flag("containers", "proxyd")
	if !okInit || !okProxyd {
		t.Fatalf("%s: podnet-node has sysctls init container %v, proxyd container %v; want both", where, okInit, okProxyd)
	}
	if initCIDR == "" || initCIDR != proxydCIDR {
		t.Errorf("%s: proxyd init --cluster-cidr=%q, proxyd --cluster-cidr=%q; want the same, given", where, initCIDR, proxydCIDR)
	}
}

// grant is one verb on one resource, cluster-wide (namespace "") or in
// one namespace, for one subject.
type grant struct{ subject, namespace, resource, verb string }

// The RBAC of deploy/ grants exactly what the daemons read and write,
// nothing more: proxyd lists and watches what it programs, gets and
// patches Nodes (its podCIDR, its NetworkUnavailable condition) and keeps
// its podCIDR claims as Leases in podnet-system only; dnsd only reads.
// A grant added or widened (a wildcard, a cluster-wide Lease) fails here.
func TestDeployRBAC(t *testing.T) {
	objs, err := manifests()
	if err != nil {
		t.Fatal(err)
	}
	rules := map[string][]rbacv1.PolicyRule{} // "Kind namespace/name"
	var bindings []struct {
		kind, namespace string
		b               rbacv1.RoleBinding
	}
	for _, u := range objs {
		key := u.GetKind() + " " + u.GetNamespace() + "/" + u.GetName()
		switch u.GetKind() {
		case "ClusterRole", "Role":
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &r); err != nil {
				t.Fatal(err)
			}
			if r.AggregationRule != nil {
				t.Errorf("%s aggregates other roles", key)
			}
			rules[key] = r.Rules
		case "ClusterRoleBinding", "RoleBinding":
			var b rbacv1.RoleBinding
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &b); err != nil {
				t.Fatal(err)
			}
			bindings = append(bindings, struct {
				kind, namespace string
				b               rbacv1.RoleBinding
			}{u.GetKind(), u.GetNamespace(), b})
		}
	}
	var got []grant
	for _, bb := range bindings {
		roleNS := ""
		if bb.b.RoleRef.Kind == "Role" {
			roleNS = bb.namespace
		}
		role, ok := rules[bb.b.RoleRef.Kind+" "+roleNS+"/"+bb.b.RoleRef.Name]
		if !ok {
			t.Errorf("%s %s binds %s %s, which deploy/ does not define", bb.kind, bb.b.Name, bb.b.RoleRef.Kind, bb.b.RoleRef.Name)
			continue
		}
		for _, s := range bb.b.Subjects {
			subject := s.Kind + " " + s.Namespace + "/" + s.Name
			for _, r := range role {
				if len(r.ResourceNames) > 0 || len(r.NonResourceURLs) > 0 {
					t.Errorf("%s: unexpected resourceNames or nonResourceURLs %+v", bb.b.RoleRef.Name, r)
				}
				for _, g := range r.APIGroups {
					for _, res := range r.Resources {
						if g != "" {
							res = g + "/" + res
						}
						for _, v := range r.Verbs {
							got = append(got, grant{subject, bb.namespace, res, v})
						}
					}
				}
			}
		}
	}
	node, dns := "ServiceAccount podnet-system/podnet-node", "ServiceAccount kube-system/podnet-dns"
	var want []grant
	add := func(subject, ns string, resources, verbs []string) {
		for _, r := range resources {
			for _, v := range verbs {
				want = append(want, grant{subject, ns, r, v})
			}
		}
	}
	read := []string{"list", "watch"}
	add(node, "", []string{"nodes"}, []string{"get", "list", "watch", "patch"})
	add(node, "", []string{"nodes/status"}, []string{"patch"})
	add(node, "", []string{"services", "namespaces", "pods", "discovery.k8s.io/endpointslices", "networking.k8s.io/networkpolicies"}, read)
	add(node, "podnet-system", []string{"coordination.k8s.io/leases"}, []string{"get", "list", "create", "delete"})
	add(dns, "", []string{"services", "namespaces", "pods", "discovery.k8s.io/endpointslices"}, read)
	cmp := func(a, b grant) int {
		return strings.Compare(a.subject+a.namespace+a.resource+a.verb, b.subject+b.namespace+b.resource+b.verb)
	}
	slices.SortFunc(got, cmp)
	slices.SortFunc(want, cmp)
	for _, g := range got {
		if _, found := slices.BinarySearchFunc(want, g, cmp); !found {
			t.Errorf("deploy/ grants %s %q on %s in %q, which podnet does not use", g.subject, g.verb, g.resource, g.namespace)
		}
	}
	for _, w := range want {
		if _, found := slices.BinarySearchFunc(got, w, cmp); !found {
			t.Errorf("deploy/ does not grant %s %q on %s in %q, which podnet needs", w.subject, w.verb, w.resource, w.namespace)
		}
	}
}

// TestDeployVariants builds deploy/ and deploy/ebpf as kubectl apply -k
// does (kubectl kustomize) and checks each says what README says of it:
// the base runs proxyd in iptables mode; the ebpf variant is the same
// objects with proxyd in ebpf mode (the last --proxy-mode wins), hostPID,
// privileged, and the node's bpffs mounted Bidirectional.
func TestDeployVariants(t *testing.T) {
	bins, err := realnode.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	build := func(dir string) []map[string]any { return kustomizeBuild(t, bins.Kubectl, dir) }
	proxyd := func(dir string, docs []map[string]any) (mode string, hostPID, privileged, bidirectional bool) {
		t.Helper()
		for _, d := range docs {
			if d["kind"] != "DaemonSet" {
				continue
			}
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(d, &ds); err != nil {
				t.Fatal(err)
			}
			for _, c := range ds.Spec.Template.Spec.Containers {
				if c.Name != "proxyd" {
					continue
				}
				for _, a := range c.Command {
					if m, ok := strings.CutPrefix(a, "--proxy-mode="); ok {
						mode = m
					}
				}
				for _, m := range c.VolumeMounts {
					bidirectional = bidirectional || (m.MountPath == "/sys/fs/bpf" && m.MountPropagation != nil && *m.MountPropagation == corev1.MountPropagationBidirectional)
				}
				privileged = c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
				return mode, ds.Spec.Template.Spec.HostPID, privileged, bidirectional
			}
		}
		t.Fatalf("%s builds no DaemonSet with a proxyd container", dir)
		return
	}
	base, variant := build("../deploy"), build("../deploy/ebpf")
	for dir, docs := range map[string][]map[string]any{"deploy/": base, "deploy/ebpf": variant} {
		for _, d := range docs {
			if d["kind"] == "DaemonSet" {
				spec, _, _ := unstructured.NestedMap(d, "spec", "template", "spec")
				checkInitClusterCIDR(t, dir, spec)
			}
		}
	}
	if mode, pid, priv, bidi := proxyd("deploy", base); mode != "iptables" || pid || priv || bidi {
		t.Errorf("deploy/: proxyd mode %q, hostPID %v, privileged %v, bpffs Bidirectional %v; want iptables and none of them", mode, pid, priv, bidi)
	}
	if mode, pid, priv, bidi := proxyd("deploy/ebpf", variant); mode != "ebpf" || !pid || !priv || !bidi {
		t.Errorf("deploy/ebpf: proxyd mode %q, hostPID %v, privileged %v, bpffs Bidirectional %v; want ebpf and all of them", mode, pid, priv, bidi)
	}
	names := func(docs []map[string]any) []string {
		var out []string
		for _, d := range docs {
			md, _ := d["metadata"].(map[string]any)
			out = append(out, fmt.Sprintf("%v %v/%v", d["kind"], md["namespace"], md["name"]))
		}
		slices.Sort(out)
		return out
	}
	if b, v := names(base), names(variant); !slices.Equal(b, v) {
		t.Errorf("deploy/ebpf installs other objects than deploy/:\n%v\n%v", v, b)
	}
	nft := build("../deploy/nftables")
	if mode, pid, priv, bidi := proxyd("deploy/nftables", nft); mode != "nftables" || pid || priv || bidi {
		t.Errorf("deploy/nftables: proxyd mode %q, hostPID %v, privileged %v, bpffs Bidirectional %v; want nftables and none of them", mode, pid, priv, bidi)
	}
	if b, v := names(base), names(nft); !slices.Equal(b, v) {
		t.Errorf("deploy/nftables installs other objects than deploy/:\n%v\n%v", v, b)
	}
	checkDnsdDrain(t, base)
}

// checkDnsdDrain: dnsd's pod gives its drain time to end before the
// kubelet kills it (--drain-max plus a forwarded query's deadline, 5 s,
// under the grace period), and its readiness probe makes a draining dnsd
// not serving within 2 s.
func checkDnsdDrain(t *testing.T, docs []map[string]any) {
	t.Helper()
	for _, d := range docs {
		md, _ := d["metadata"].(map[string]any)
		if (d["kind"] != "Deployment" && d["kind"] != "DaemonSet") || md["name"] != "podnet-dns" {
			continue
		}
		raw, _ := d["spec"].(map[string]any)
		var tmpl corev1.PodTemplateSpec
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw["template"].(map[string]any), &tmpl); err != nil {
			t.Fatal(err)
		}
		spec := tmpl.Spec
		maxDrain := 20 * time.Second // dnsd's default
		for _, a := range spec.Containers[0].Command {
			if v, ok := strings.CutPrefix(a, "--drain-max="); ok {
				var err error
				if maxDrain, err = time.ParseDuration(v); err != nil {
					t.Fatalf("dnsd %s: %v", a, err)
				}
			}
		}
		grace := 30 * time.Second
		if spec.TerminationGracePeriodSeconds != nil {
			grace = time.Duration(*spec.TerminationGracePeriodSeconds) * time.Second
		}
		if maxDrain+5*time.Second >= grace {
			t.Errorf("podnet-dns: --drain-max %v + 5s forward deadline not under the grace period %v", maxDrain, grace)
		}
		p := spec.Containers[0].ReadinessProbe
		if p == nil || p.PeriodSeconds*max(p.FailureThreshold, 1) > 2 {
			t.Errorf("podnet-dns readiness probe %+v: a draining dnsd stays serving for more than 2s", p)
		}
		return
	}
	t.Error("deploy/ has no podnet-dns Deployment or DaemonSet")
}
