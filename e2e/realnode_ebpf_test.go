package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ebpfmode "github.com/podnet/podnet/dataplane/proxy/ebpf"
	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
)

// TestRealNodeEBPF installs podnet with the ebpf component (deploy/ebpf)
// on a kubelet + containerd node: proxyd's socket programs go on the
// node's cgroup2 root (the lab binds the node's own cgroup there, so the
// host's is never touched, and the test checks it is not), its maps are
// pinned in the node's bpffs, and a pod resolves names through 10.96.0.10
// and reaches a ClusterIP Service while the node holds no Service rule in
// iptables.
func TestRealNodeEBPF(t *testing.T) {
	roottest.Require(t)
	hostRoot, err := ebpfmode.Cgroup2Root()
	if err != nil {
		t.Fatal(err)
	}
	before := cgroupConnectProgs(t, hostRoot)
	c := startRealClusterOpts(t, []lab.NodeSpec{{Name: "node1", IP: netip.MustParsePrefix("192.168.10.11/24")}},
		realClusterOptions{variant: "ebpf"})
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	n := c.nodes[0]

	ds, err := c.admin.AppsV1().DaemonSets("podnet-system").Get(ctx, "podnet-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The last --proxy-mode is the one proxyd goes by.
	mode := ""
	for _, a := range ds.Spec.Template.Spec.Containers[0].Command {
		if m, ok := strings.CutPrefix(a, "--proxy-mode="); ok {
			mode = m
		}
	}
	if mode != "ebpf" || !ds.Spec.Template.Spec.HostPID {
		c.errorf("the DaemonSet with deploy/ebpf: proxy mode %q, hostPID %v; want ebpf, true", mode, ds.Spec.Template.Spec.HostPID)
	}
	c.startWeb(ctx)
	c.checkWeb(ctx)

	// The programs sit on the node's cgroup, none was added on the host's.
	if progs := cgroupConnectProgs(t, n.Node.Cgroup); len(progs) == 0 {
		c.errorf("no connect4 program on the node's cgroup %s", n.Node.Cgroup)
	}
	if after := cgroupConnectProgs(t, hostRoot); !slices.Equal(before, after) {
		c.errorf("connect4 programs on the host's cgroup2 root %s: %v, before the test %v", hostRoot, after, before)
	}
	if pins, err := n.Exec(ctx, "ls", "/sys/fs/bpf/podnet"); err != nil || !strings.Contains(pins, "services_v2") {
		c.errorf("pins in the node's /sys/fs/bpf/podnet: %q, %v", pins, err)
	}
	if _, err := os.Stat("/sys/fs/bpf/podnet"); err == nil {
		c.errorf("the host has /sys/fs/bpf/podnet; the node's pins belong in its own bpffs")
	}

	svc, err := c.admin.CoreV1().Services("default").Get(ctx, "web", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// proxyd status in the pod reads the pinned maps: web's ClusterIP with
	// its two pods, nothing disagreeing with what proxyd reports (asked
	// until it holds, for at most 10 s: proxyd syncs at most once a second).
	pods, err := c.admin.CoreV1().Pods("default").List(ctx, metav1.ListOptions{LabelSelector: "app=web"})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, p := range pods.Items {
		want = append(want, netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), 8080).String())
	}
	slices.Sort(want)
	var problem string
	c.execUntil(ctx, func(out string, err error) bool {
		var st struct {
			BPFMaps *struct {
				ebpfmode.Programmed
				Error       string   `json:"error"`
				Differences []string `json:"differences"`
			} `json:"bpfMaps"`
		}
		if err != nil || json.Unmarshal([]byte(out), &st) != nil || st.BPFMaps == nil || st.BPFMaps.Error != "" {
			problem = fmt.Sprintf("proxyd status -o json in the pod: %v\n%s", err, out)
			return false
		}
		fe := slices.IndexFunc(st.BPFMaps.Frontends, func(f ebpfmode.ProgrammedFrontend) bool {
			return f.Address == svc.Spec.ClusterIP+":80" && f.Protocol == "TCP" && f.Scope == "socket"
		})
		if fe < 0 || !slices.Equal(slices.Sorted(slices.Values(st.BPFMaps.Frontends[fe].Backends)), want) ||
			len(st.BPFMaps.Differences)+len(st.BPFMaps.Problems) > 0 {
			problem = fmt.Sprintf("proxyd status in the pod: web's ClusterIP %s in the maps at %d (want backends %v); differences %v, problems %v\n%s",
				svc.Spec.ClusterIP, fe, want, st.BPFMaps.Differences, st.BPFMaps.Problems, out)
			return false
		}
		problem = ""
		return true
	}, "-n", "podnet-system", "exec", "daemonset/podnet-node", "-c", "proxyd", "--", "/usr/local/bin/proxyd", "status", "-o", "json")
	if problem != "" {
		c.errorf("%s", problem)
	}

	saved := 0
	for _, save := range []string{"iptables-save", "iptables-legacy-save", "iptables-nft-save"} {
		out, err := n.Exec(ctx, save)
		if err != nil {
			continue // not on this host
		}
		saved++
		for _, s := range []string{"PODSVC", svc.Spec.ClusterIP, "10.96.0.10"} {
			if strings.Contains(out, s) {
				c.errorf("%s on the node shows %q; ebpf mode writes no Service rules:\n%s", save, s, out)
			}
		}
	}
	if saved == 0 {
		c.errorf("no iptables-save ran on the node")
	}
}

// cgroupConnectProgs lists the ids of the connect4 programs attached to
// the cgroup v2 directory dir itself.
func cgroupConnectProgs(t *testing.T, dir string) []ebpf.ProgramID {
	t.Helper()
	f, err := os.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := link.QueryPrograms(link.QueryOptions{Target: int(f.Fd()), Attach: ebpf.AttachCGroupInet4Connect})
	if err != nil {
		t.Fatalf("query the programs of %s: %v", dir, err)
	}
	var ids []ebpf.ProgramID
	for _, p := range res.Programs {
		ids = append(ids, p.ID)
	}
	slices.Sort(ids)
	return ids
}
