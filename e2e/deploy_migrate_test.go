package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/podnet/podnet/e2e/realnode"
)

// migrateStage is what kubectl kustomize builds from one stage's overlay.
type migrateStage struct {
	daemonSets  map[string]*appsv1.DaemonSet
	deployments map[string]*appsv1.Deployment
	services    map[string]bool
}

func buildStage(t *testing.T, kubectl, dir string) migrateStage {
	t.Helper()
	st := migrateStage{daemonSets: map[string]*appsv1.DaemonSet{}, deployments: map[string]*appsv1.Deployment{}, services: map[string]bool{}}
	for _, doc := range kustomizeBuild(t, kubectl, dir) {
		switch doc["kind"] {
		case "DaemonSet":
			var ds appsv1.DaemonSet
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(doc, &ds); err != nil {
				t.Fatal(err)
			}
			st.daemonSets[ds.Name] = &ds
		case "Deployment":
			var d appsv1.Deployment
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(doc, &d); err != nil {
				t.Fatal(err)
			}
			st.deployments[d.Name] = &d
		case "Service":
			md, _ := doc["metadata"].(map[string]any)
			st.services[md["name"].(string)] = true
		}
	}
	return st
}

// lastFlag is the value of the last --name=value in cmd (the one proxyd
// keeps), "" if none; a flag without a value reads "true".
func lastFlag(cmd []string, name string) string {
	v := ""
	for _, a := range cmd {
		if a == "--"+name {
			v = "true"
		} else if s, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			v = s
		}
	}
	return v
}

func container(cs []corev1.Container, name string) *corev1.Container {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// nodeAffinity is the DaemonSet's required podnet.io/pod-network operator.
func nodeAffinity(ds *appsv1.DaemonSet) string {
	a := ds.Spec.Template.Spec.Affinity
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		return ""
	}
	for _, term := range a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms {
		for _, e := range term.MatchExpressions {
			if e.Key == "podnet.io/pod-network" {
				return string(e.Operator) + " " + strings.Join(e.Values, ",")
			}
		}
	}
	return ""
}

// TestDeployMigrationStages builds each stage of README's migration
// (deploy/migrate/*) and checks it says what README says of it: beside
// kube-proxy on ports of its own programming nothing; then the Services
// taken over with flannel and CoreDNS left alone; then podnet-dns joining
// kube-dns; then the pod network node by node, two DaemonSets on disjoint
// nodes. Every container's command line is accepted by the binaries built
// from this tree (PODNET_BIN).
func TestDeployMigrationStages(t *testing.T) {
	bins, err := realnode.FindBinaries()
	if err != nil {
		t.Fatal(err)
	}
	binDir := os.Getenv("PODNET_BIN")
	if binDir == "" {
		binDir = "../bin"
	}
	stages := map[string]migrateStage{}
	for _, s := range []string{"1-beside", "2-services", "3-dns", "4-pod-network"} {
		stages[s] = buildStage(t, bins.Kubectl, "../deploy/migrate/"+s)
	}
	type want struct {
		ds, proxyMode, podNetwork, healthz, takeOver, flannel, affinity string
		installCNI                                                      bool
	}
	for stage, w := range map[string][]want{
		"1-beside":      {{"podnet-node", "none", "none", "0.0.0.0:10356", "", "", "NotIn podnet", false}},
		"2-services":    {{"podnet-node", "iptables", "none", "0.0.0.0:10256", "true", "", "NotIn podnet", false}},
		"3-dns":         {{"podnet-node", "iptables", "none", "0.0.0.0:10256", "true", "", "NotIn podnet", false}},
		"4-pod-network": {{"podnet-node", "iptables", "", "0.0.0.0:10256", "true", "true", "In podnet", true}, {"podnet-node-on-flannel", "iptables", "none", "0.0.0.0:10256", "true", "", "NotIn podnet", false}},
	} {
		st := stages[stage]
		if len(st.daemonSets) != len(w) {
			t.Errorf("%s: %d DaemonSets, want %d", stage, len(st.daemonSets), len(w))
		}
		for _, w := range w {
			ds := st.daemonSets[w.ds]
			if ds == nil {
				t.Errorf("%s: no DaemonSet %s", stage, w.ds)
				continue
			}
			p := container(ds.Spec.Template.Spec.Containers, "proxyd")
			got := want{w.ds, lastFlag(p.Command, "proxy-mode"), lastFlag(p.Command, "pod-network"), lastFlag(p.Command, "healthz-bind-address"),
				lastFlag(p.Command, "take-over-from-kube-proxy"), lastFlag(p.Command, "flannel-annotations"), nodeAffinity(ds),
				container(ds.Spec.Template.Spec.InitContainers, "install-cni") != nil}
			if got != w {
				t.Errorf("%s: %s is\n%+v, want\n%+v", stage, w.ds, got, w)
			}
			if port := p.LivenessProbe.HTTPGet.Port.IntValue(); !strings.HasSuffix(w.healthz, ":"+p.LivenessProbe.HTTPGet.Port.String()) {
				t.Errorf("%s: %s's liveness probe asks port %d, proxyd serves %s", stage, w.ds, port, w.healthz)
			}
			if c := container(ds.Spec.Template.Spec.InitContainers, "install-cni"); c != nil && lastFlag(c.Command, "move-others-aside") != "true" {
				t.Errorf("%s: %s installs podnet's CNI config without moving flannel's aside", stage, w.ds)
			}
			checkCommandsAccepted(t, binDir, stage, ds.Spec.Template.Spec)
		}
	}
	// DNS: podnet's joins kube-dns only from stage 3, its pods labelled
	// as the Service selects and gated by a readiness probe.
	for stage, st := range stages {
		d, hasDNS := st.deployments["podnet-dns"]
		if wantDNS := stage >= "3"; hasDNS != wantDNS || st.services["kube-dns"] != wantDNS {
			t.Errorf("%s: podnet-dns %v, kube-dns Service %v; want %v", stage, hasDNS, st.services["kube-dns"], wantDNS)
		}
		if hasDNS {
			c := container(d.Spec.Template.Spec.Containers, "dnsd")
			if d.Spec.Template.Labels["k8s-app"] != "kube-dns" || c.ReadinessProbe == nil || c.ReadinessProbe.HTTPGet.Path != "/ready" {
				t.Errorf("%s: podnet-dns labels %v, readiness %+v: want k8s-app kube-dns behind /ready", stage, d.Spec.Template.Labels, c.ReadinessProbe)
			}
			checkCommandsAccepted(t, binDir, stage, d.Spec.Template.Spec)
		}
	}
	for stage, st := range stages {
		checkSelectorsDisjoint(t, stage, st.daemonSets)
	}
}

// checkSelectorsDisjoint fails when a DaemonSet's selector matches another
// one's pods (stage 4 runs two): the two would then both claim them.
func checkSelectorsDisjoint(t *testing.T, stage string, daemonSets map[string]*appsv1.DaemonSet) {
	t.Helper()
	for _, a := range daemonSets {
		sel, err := metav1.LabelSelectorAsSelector(a.Spec.Selector)
		if err != nil {
			t.Fatalf("%s: %s: %v", stage, a.Name, err)
		}
		if !sel.Matches(labels.Set(a.Spec.Template.Labels)) {
			t.Errorf("%s: %s does not select its own pods (%v)", stage, a.Name, a.Spec.Template.Labels)
		}
		for _, b := range daemonSets {
			if a != b && sel.Matches(labels.Set(b.Spec.Template.Labels)) {
				t.Errorf("%s: %s selects %s's pods: %v matches %v", stage, a.Name, b.Name, a.Spec.Selector.MatchLabels, b.Spec.Template.Labels)
			}
		}
	}
}

// checkCommandsAccepted runs each container's binary with its arguments
// and --help last: it exits 0 only once every flag before it was accepted.
func checkCommandsAccepted(t *testing.T, binDir, stage string, spec corev1.PodSpec) {
	t.Helper()
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		bin := filepath.Join(binDir, filepath.Base(c.Command[0]))
		out, err := exec.Command(bin, append(c.Command[1:], "--help")...).CombinedOutput()
		if err != nil {
			t.Errorf("%s: %s rejects %q: %v\n%s", stage, filepath.Base(bin), c.Command[1:], err, out)
		}
	}
}
