package e2e

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/roottest"
	"github.com/podnet/podnet/e2e/lab"
	"sigs.k8s.io/yaml"
)

func TestLabUnderlay(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	ctx := t.Context()

	cases := []struct {
		from, to string
	}{
		{"node1", "node2"}, // segment A, same bridge
		{"node2", "node3"},
		{"node3", "node1"},
		{"node4", "node1"}, // segment B → A through the router
		{"node1", "node4"},
		{"node3", "node4"},
	}
	for _, c := range cases {
		from, to := l.Node(c.from), l.Node(c.to)
		if _, err := from.Ping(ctx, to.IP); err != nil {
			t.Errorf("%s → %s (%s): %v", c.from, c.to, to.IP, err)
		}
	}
	for _, n := range l.Nodes {
		if _, err := n.Ping(ctx, l.OutsideIP); err != nil {
			t.Errorf("%s → outside (%s): %v", n.Name, l.OutsideIP, err)
		}
	}
	// A ping that must fail proves the checks above could: nothing in the
	// lab owns this address on segment A.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := l.Node("node1").Ping(short, netip.MustParseAddr("192.168.10.99")); err == nil {
		t.Errorf("node1 → 192.168.10.99: got a reply from an address nobody has")
	}

	// Segment B's packets really cross the router: node4 sees the router's
	// address as its first hop, node1 does not.
	n4 := l.Node("node4")
	out, err := n4.Exec(ctx, "ip", "-4", "route", "get", l.Node("node1").IP.String())
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "via 192.168.20.1 dev eth0") {
		t.Errorf("node4 route to node1 = %q, want via 192.168.20.1 dev eth0", out)
	}
	out, err = l.Node("node1").Exec(ctx, "ip", "-4", "route", "get", l.Node("node2").IP.String())
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "via") {
		t.Errorf("node1 route to node2 = %q, want direct on the segment", out)
	}
}

func TestLabNodeProcesses(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	ctx := t.Context()
	n := l.Node("node2")

	// Exec runs in the node's namespace: it sees the node's address.
	out, err := n.Exec(ctx, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, " "+n.IP.String()+"/24 ") {
		t.Errorf("node2 eth0 = %q, want %s/24", out, n.IP)
	}
	// ... and in the node's cgroup.
	out, err = n.Exec(ctx, "cat", "/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if want := "0::/" + filepath.Base(n.Cgroup) + "\n"; !strings.Contains(out, want) {
		t.Errorf("cgroups of a node2 process = %q, want a line %q", out, want)
	}
	// A failing command's error carries its output.
	if _, err := n.Exec(ctx, "sh", "-c", "echo boom >&2; exit 3"); err == nil || !strings.Contains(err.Error(), "boom") {
		t.Errorf("failing Exec: err = %v, want one that includes the output", err)
	}

	p, err := n.Start("echo", "sh", "-c", "echo started; exec sleep 60")
	if err != nil {
		t.Fatal(err)
	}
	procs := readFile(t, filepath.Join(n.Cgroup, "cgroup.procs"))
	if !strings.Contains(procs, strconv.Itoa(p.Pid())+"\n") {
		t.Errorf("pid %d not in %s/cgroup.procs (%q)", p.Pid(), n.Cgroup, procs)
	}
	waitFor(t, 5*time.Second, func() bool { return strings.Contains(p.Output(), "started") }, "output of a started process")
	if err := p.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	select {
	case <-p.Done():
	default:
		t.Errorf("process still running after Stop")
	}

	// A process that fails while shutting down reports it on Stop.
	r, err := n.Start("trap", "sh", "-c", `trap "exit 3" TERM; echo ready; while :; do sleep 0.05; done`)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, func() bool { return strings.Contains(r.Output(), "ready") }, "the trap to be set")
	if err := r.Stop(); err == nil || !strings.Contains(err.Error(), "exit status 3") {
		t.Errorf("Stop of a process exiting 3 on SIGTERM: err = %v, want exit status 3", err)
	}

	// A process that exits on its own with an error reports it on Wait.
	q, err := n.Start("fail", "sh", "-c", "exit 7")
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Wait(ctx); err == nil || !strings.Contains(err.Error(), "exit status 7") {
		t.Errorf("Wait of a failing process: err = %v, want exit status 7", err)
	}
}

func TestLabState(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})

	var list struct {
		Kind  string `json:"kind"`
		Items []struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
			Spec struct {
				PodCIDR  string   `json:"podCIDR"`
				PodCIDRs []string `json:"podCIDRs"`
			} `json:"spec"`
			Status struct {
				Addresses []struct{ Type, Address string } `json:"addresses"`
			} `json:"status"`
		} `json:"items"`
	}
	if err := yaml.Unmarshal([]byte(readFile(t, filepath.Join(l.StateDir(), "nodes.yaml"))), &list); err != nil {
		t.Fatal(err)
	}
	if list.Kind != "List" || len(list.Items) != 4 {
		t.Fatalf("nodes.yaml: kind %q with %d items, want a List of 4 nodes", list.Kind, len(list.Items))
	}
	want := map[string][3]string{ // name → InternalIP, podCIDR, zone
		"node1": {"192.168.10.11", "10.244.1.0/24", "zone-a"},
		"node2": {"192.168.10.12", "10.244.2.0/24", "zone-a"},
		"node3": {"192.168.10.13", "10.244.3.0/24", "zone-a"},
		"node4": {"192.168.20.11", "10.244.4.0/24", "zone-b"},
	}
	for _, it := range list.Items {
		w, ok := want[it.Metadata.Name]
		if !ok || it.Kind != "Node" || it.APIVersion != "v1" {
			t.Errorf("unexpected item %s %s %q", it.APIVersion, it.Kind, it.Metadata.Name)
			continue
		}
		var ip string
		for _, a := range it.Status.Addresses {
			if a.Type == "InternalIP" {
				ip = a.Address
			}
		}
		got := [3]string{ip, it.Spec.PodCIDR, it.Metadata.Labels["topology.kubernetes.io/zone"]}
		if got != w || len(it.Spec.PodCIDRs) != 1 || it.Spec.PodCIDRs[0] != w[1] {
			t.Errorf("node %s: InternalIP, podCIDR, zone = %v (podCIDRs %v), want %v", it.Metadata.Name, got, it.Spec.PodCIDRs, w)
		}
		if n := l.Node(it.Metadata.Name); n == nil || n.PodCIDR.String() != w[1] {
			t.Errorf("lab node %s does not match nodes.yaml", it.Metadata.Name)
		}
	}
	if s := readFile(t, filepath.Join(l.StateDir(), "namespaces.yaml")); !strings.Contains(s, "name: kube-system") || !strings.Contains(s, "name: default") {
		t.Errorf("namespaces.yaml lacks default or kube-system:\n%s", s)
	}

	if err := l.WriteState("svc/web.yaml", "kind: Service\n"); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, filepath.Join(l.StateDir(), "svc", "web.yaml")); got != "kind: Service\n" {
		t.Errorf("state file = %q", got)
	}
	if err := l.RemoveState("svc/web.yaml"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(l.StateDir(), "svc", "web.yaml")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("state file still there after RemoveState: %v", err)
	}
	if err := l.WriteState("../escape.yaml", "x"); err == nil {
		t.Errorf("WriteState outside the state dir succeeded")
	}

	n := l.Node("node3")
	if err := n.WriteNodeConfig(); err != nil {
		t.Fatal(err)
	}
	if got := readFile(t, n.NodeConfigPath()); !strings.Contains(got, `"podCIDR": "10.244.3.0/24"`) || !strings.Contains(got, `"clusterCIDR": "10.244.0.0/16"`) {
		t.Errorf("node.json = %s", got)
	}
}

// hostNetState is the host's own network configuration as the tools print
// it, with the fields that change by themselves removed.
func hostNetState(t *testing.T) map[string]string {
	t.Helper()
	state := map[string]string{}
	for _, args := range [][]string{
		{"ip", "link"},
		{"ip", "-4", "route", "show", "table", "all"},
		{"ip", "-6", "route", "show", "table", "all"},
		{"ip", "rule"},
		{"ip", "-6", "rule"},
		{"iptables-save"},
		{"ip6tables-save"},
	} {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
		state[strings.Join(args, " ")] = stableNetState(string(out))
	}
	// The sysctls a node agent sets: forwarding, rp_filter, br_netfilter.
	for _, pattern := range []string{
		"/proc/sys/net/ipv4/ip_forward",
		"/proc/sys/net/ipv4/conf/*/*",
		"/proc/sys/net/ipv6/conf/all/forwarding",
		"/proc/sys/net/bridge/*",
	} {
		paths, _ := filepath.Glob(pattern)
		for _, p := range paths {
			if v, err := os.ReadFile(p); err == nil { // some are write-only
				state[p] = string(v)
			}
		}
	}
	return state
}

var (
	// counters matches the [packets:bytes] of iptables-save chain lines.
	counters = regexp.MustCompile(`\[\d+:\d+\]`)
	// expires matches the remaining lifetime of routes learnt from router
	// advertisements or DHCP.
	expires = regexp.MustCompile(`expires -?\d+sec`)
)

// stableNetState drops what changes by itself between two calls while the
// configuration stays the same: iptables-save's "#" comment lines carry the
// time of the dump, its chain counters count whatever traffic the host had
// meanwhile, and learnt routes count down their lifetime. Links, routes,
// rules and policies stay.
func stableNetState(s string) string {
	var b strings.Builder
	sc := bufio.NewScanner(strings.NewReader(s))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			continue
		}
		line = counters.ReplaceAllString(line, "[counters]")
		b.WriteString(expires.ReplaceAllString(line, "expires"))
		b.WriteByte('\n')
	}
	return b.String()
}

func TestLabLeavesHostAndNothingBehind(t *testing.T) {
	roottest.Require(t)
	before := hostNetState(t)

	ctx := t.Context()
	l, err := lab.New(ctx, lab.Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			l.Close()
		}
	})
	// Use the lab so that whatever it does at runtime happens too.
	if _, err := l.Node("node1").Ping(ctx, l.Node("node4").IP); err != nil {
		t.Errorf("node1 → node4: %v", err)
	}
	if _, err := l.Node("node1").Start("sleeper", "sleep", "60"); err != nil {
		t.Fatal(err)
	}
	if err := l.Node("node2").SetResolvConf("nameserver 203.0.113.10\n"); err != nil {
		t.Fatal(err)
	}
	// The whole dataplane runs too, since the point is that nothing of it
	// reaches the host: proxyd (routes, VXLAN, iptables, sysctls) on every
	// node, and pods added by the CNI plugin on both segments.
	errs := make([]error, len(l.Nodes))
	var wg sync.WaitGroup
	for i, n := range l.Nodes {
		wg.Go(func() { _, errs[i] = n.StartProxyd(ctx) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	var pods []*lab.Pod
	for _, n := range []*lab.Node{l.Node("node1"), l.Node("node4")} {
		p, err := n.AddPod(ctx, "p")
		if err != nil {
			t.Fatal(err)
		}
		pods = append(pods, p)
	}
	if _, err := pods[0].Ping(ctx, pods[1].IP); err != nil {
		t.Errorf("pod on node1 → pod on node4: %v", err)
	}
	workDir := l.WorkDir
	namespaces := l.Namespaces()
	cgroups := []string{l.OutsideHost.Cgroup}
	for _, n := range l.Nodes {
		cgroups = append(cgroups, n.Cgroup)
	}
	if got := labNetns(t, l.Prefix); len(got) != len(namespaces) {
		t.Errorf("before Close: namespaces with prefix %s = %v, want %v", l.Prefix, got, namespaces)
	}

	start := time.Now()
	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	closed = true
	t.Logf("Close took %v", time.Since(start))
	if err := l.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}

	if got := labNetns(t, l.Prefix); len(got) > 0 {
		t.Errorf("after Close: namespaces with prefix %s remain: %v", l.Prefix, got)
	}
	for _, cg := range cgroups {
		if _, err := os.Stat(cg); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close: cgroup %s remains (%v)", cg, err)
		}
	}
	if _, err := os.Stat(filepath.Join("/etc/netns", l.Node("node2").NS)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close: /etc/netns/%s remains (%v)", l.Node("node2").NS, err)
	}
	if _, err := os.Stat(workDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close: work dir %s remains (%v)", workDir, err)
	}
	if _, err := os.Stat(filepath.Join(lab.RunDir, l.Prefix+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Close: run record remains (%v)", err)
	}

	after := hostNetState(t)
	for what, b := range before {
		if a, ok := after[what]; ok && a != b {
			t.Errorf("host network state changed: %s\nbefore:\n%s\nafter:\n%s", what, b, a)
		}
	}
	for what := range after {
		// Loading br_netfilter adds /proc/sys/net/bridge; its defaults
		// are the kernel's, not something the lab set.
		if _, ok := before[what]; !ok && !strings.HasPrefix(what, "/proc/sys/net/bridge/") {
			t.Errorf("host network state gained %s:\n%s", what, after[what])
		}
	}
}

// labNetns lists the named namespaces of the run with prefix, as `ip netns
// list` shows them.
func labNetns(t *testing.T, prefix string) []string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	var names []string
	for line := range strings.Lines(string(out)) {
		if name, _, _ := strings.Cut(strings.TrimSpace(line), " "); strings.HasPrefix(name, prefix+"-") {
			names = append(names, name)
		}
	}
	return names
}

func TestLabRemovesCrashedRun(t *testing.T) {
	roottest.Require(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()

	// A child process builds a lab and is killed without closing it.
	prefix := fmt.Sprintf("pn%04x", os.Getpid()&0xffff^0x5a5a)
	child := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), crashChildEnv+"="+prefix)
	child.Stderr = os.Stderr
	stdout, err := child.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		child.Process.Kill()
		child.Wait()
		t.Fatalf("crash child: %v (output %q)", err, line)
	}
	var started, orphan int
	if _, err := fmt.Sscanf(line, "ready %d %d", &started, &orphan); err != nil {
		t.Fatalf("crash child said %q: %v", line, err)
	}
	child.Process.Kill()
	child.Wait()
	t.Cleanup(func() { syscall.Kill(orphan, syscall.SIGKILL) }) // if the sweep failed
	// What the lab started dies with the process that started it...
	waitFor(t, 5*time.Second, func() bool { return processGone(started) }, "the crashed run's started process to die with it")

	if got := labNetns(t, prefix); len(got) != 7 {
		t.Fatalf("crashed run left namespaces %v, want 7 (underlay, router, outside, 4 nodes)", got)
	}
	// ... but what that forked away lives on until the sweep.
	if processGone(orphan) {
		t.Fatalf("the crashed run's orphan process %d is not running before the sweep", orphan)
	}
	// A namespace of the family without any run record (its record lost
	// with a cleaned /run, say) is stale too.
	unrecorded := fmt.Sprintf("pn%04x", (os.Getpid()+1)&0xffff^0x5a5a)
	if out, err := exec.Command("ip", "netns", "add", unrecorded+"-node1").CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", unrecorded+"-node1").Run() })

	l := lab.Start(t, lab.Options{})
	if got := labNetns(t, prefix); len(got) > 0 {
		t.Errorf("namespaces of the crashed run survived the next New: %v", got)
	}
	if got := labNetns(t, unrecorded); len(got) > 0 {
		t.Errorf("namespace of a run without a record survived the next New: %v", got)
	}
	cgroups, _ := filepath.Glob(filepath.Join(filepath.Dir(l.Nodes[0].Cgroup), "podnet-"+prefix+"-*"))
	if len(cgroups) > 0 {
		t.Errorf("cgroups of the crashed run survived the next New: %v", cgroups)
	}
	waitFor(t, 5*time.Second, func() bool { return processGone(orphan) }, "the crashed run's process to die")
	if _, err := os.Stat(filepath.Join(lab.RunDir, prefix+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("record of the crashed run survived: %v", err)
	}
	// The new lab itself is whole.
	if got := labNetns(t, l.Prefix); len(got) != 7 {
		t.Errorf("new lab has namespaces %v, want 7", got)
	}
}

func TestLabPods(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	ctx := t.Context()
	if err := lab.PluginSupportsADD(ctx, l.BinDir); err != nil {
		t.Fatalf("the CNI plugin cannot run pods: %v", err)
	}
	// Without a node config the plugin refuses ADD; the lab removes the
	// pod's namespace again and reports the plugin's reason.
	n2 := l.Node("node2")
	if p, err := n2.AddPod(ctx, "early"); err == nil {
		t.Errorf("pod %s added on a node without node config", p.IP)
	} else if !strings.Contains(err.Error(), "CNI ADD") {
		t.Errorf("AddPod without node config: %v, want the plugin's ADD error", err)
	}
	if slices.Contains(labNetns(t, l.Prefix), n2.NS+"-early") || slices.Contains(l.Namespaces(), n2.NS+"-early") {
		t.Errorf("namespace of the failed pod is still there")
	}

	n := l.Node("node1")
	if err := n.WriteNodeConfig(); err != nil {
		t.Fatal(err)
	}
	a, err := n.AddPod(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.AddPod(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []*lab.Pod{a, b} {
		if !n.PodCIDR.Contains(p.IP) {
			t.Errorf("pod %s has IP %s outside node1's podCIDR %s", p.Name, p.IP, n.PodCIDR)
		}
		out, err := p.Exec(ctx, "ip", "-4", "-o", "addr", "show", "dev", "eth0")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, " "+p.IP.String()+"/") {
			t.Errorf("pod %s eth0 = %q, want %s", p.Name, out, p.IP)
		}
	}
	if a.IP == b.IP {
		t.Fatalf("both pods got %s", a.IP)
	}
	const resolv = "nameserver 10.96.0.10\nsearch default.svc.cluster.local svc.cluster.local cluster.local\noptions ndots:5\n"
	if err := b.SetResolvConf(resolv); err != nil {
		t.Fatal(err)
	}
	if out, err := b.Exec(ctx, "cat", "/etc/resolv.conf"); err != nil || out != resolv {
		t.Errorf("pod b /etc/resolv.conf = %q (%v), want %q", out, err, resolv)
	}
	if out, err := a.Exec(ctx, "cat", "/etc/resolv.conf"); err == nil && out == resolv {
		t.Errorf("pod a sees pod b's resolv.conf")
	}
	if _, err := a.Ping(ctx, b.IP); err != nil {
		t.Errorf("pod a → pod b: %v", err)
	}
	if _, err := b.Ping(ctx, a.IP); err != nil {
		t.Errorf("pod b → pod a: %v", err)
	}
	if err := n.DeletePod(ctx, b); err != nil {
		t.Fatal(err)
	}
	if got := labNetns(t, b.NS); len(got) > 0 || slices.Contains(labNetns(t, l.Prefix), b.NS) {
		t.Errorf("pod namespace %s still there after DeletePod", b.NS)
	}
	if _, err := os.Stat(filepath.Join("/etc/netns", b.NS)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("/etc/netns/%s still there after DeletePod (%v)", b.NS, err)
	}
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := a.Ping(short, b.IP); err == nil {
		t.Errorf("pod a → deleted pod b: got a reply")
	}
}

// processGone reports whether pid has exited. A zombie counts as gone: it
// waits only for whoever inherited it (init here) to reap it.
func processGone(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || strings.HasPrefix(s[i+1:], " Z")
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

func waitFor(t *testing.T, timeout time.Duration, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestLabEcho(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	ctx := t.Context()
	n1, n2, n4 := l.Node("node1"), l.Node("node2"), l.Node("node4")

	if _, err := n2.StartEcho(lab.EchoOptions{HTTP: []string{":8080"}, TCP: []string{":8081"}, UDP: []string{":8082"}}); err != nil {
		t.Fatal(err)
	}
	for proto, port := range map[string]string{"http": "8080", "tcp": "8081", "udp": "8082"} {
		got, err := n1.Probe(ctx, proto, n2.IP.String()+":"+port)
		if err != nil {
			t.Errorf("node1 → node2 %s: %v", proto, err)
			continue
		}
		if !strings.HasPrefix(got, "node2 "+n1.IP.String()+":") {
			t.Errorf("node1 → node2 %s answered %q, want node2 seeing %s", proto, got, n1.IP)
		}
	}
	// Nothing listens there: the probe must fail, and fast (refused).
	if got, err := n1.Probe(ctx, "tcp", n2.IP.String()+":9"); err == nil {
		t.Errorf("probe of a closed port answered %q", got)
	}

	// The outside reaches a node through the router without NAT.
	if _, err := n4.StartEcho(lab.EchoOptions{TCP: []string{":80"}}); err != nil {
		t.Fatal(err)
	}
	got, err := l.OutsideHost.Probe(ctx, "tcp", n4.IP.String()+":80")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "node4 "+l.OutsideIP.String()+":") {
		t.Errorf("outside → node4 answered %q, want node4 seeing %s", got, l.OutsideIP)
	}

	if err := lab.PluginSupportsADD(ctx, l.BinDir); err != nil {
		t.Fatalf("the CNI plugin cannot run pods: %v", err)
	}
	if err := n1.WriteNodeConfig(); err != nil {
		t.Fatal(err)
	}
	a, err := n1.AddPod(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n1.AddPod(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.StartEcho(lab.EchoOptions{UDP: []string{":53"}}); err != nil {
		t.Fatal(err)
	}
	got, err = b.Probe(ctx, "udp", a.IP.String()+":53")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, "a "+b.IP.String()+":") {
		t.Errorf("pod b → pod a udp answered %q, want a seeing %s", got, b.IP)
	}
}

// demoBinary is the podnet-lab command under test.
func demoBinary(t *testing.T) string { return commandBinary(t, "podnet-lab", "./cmd/podnet-lab") }

// TestLabDemoInterrupted stops `podnet-lab demo` with SIGTERM in the middle
// of a step: it must tear its lab down before it exits.
func TestLabDemoInterrupted(t *testing.T) {
	roottest.Require(t)
	bin := demoBinary(t)
	l := lab.Start(t, lab.Options{})
	cmd := exec.CommandContext(t.Context(), bin, "demo", "--bin-dir", l.BinDir)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var prefix string
	var seen strings.Builder
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		line := sc.Text()
		seen.WriteString(line + "\n")
		if m := regexp.MustCompile(`^podnet lab (pn[0-9a-f]{4}):`).FindStringSubmatch(line); m != nil {
			prefix = m[1]
		}
		if strings.HasPrefix(line, "[2/") { // proxyd is starting on every node
			break
		}
	}
	if prefix == "" {
		cmd.Process.Kill()
		cmd.Wait()
		t.Fatalf("demo output without the lab's name:\n%s", seen.String())
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	go io.Copy(io.Discard, stdout)
	err = cmd.Wait()
	if err == nil {
		t.Errorf("interrupted demo exited 0")
	}
	if got := labNetns(t, prefix); len(got) > 0 {
		t.Errorf("interrupted demo left namespaces %v (stderr %s)", got, stderr.String())
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(l.Nodes[0].Cgroup), "podnet-"+prefix+"-*")); len(left) > 0 {
		t.Errorf("interrupted demo left cgroups %v", left)
	}
	if _, err := os.Stat(filepath.Join(lab.RunDir, prefix+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("interrupted demo left its run record (%v)", err)
	}
}

// TestLabDemo runs `podnet-lab demo --keep` as `make demo KEEP=1` does:
// every step must pass, the lab must stay up (and survive the next lab's
// sweep), and `podnet-lab down` must remove it.
func TestLabDemo(t *testing.T) {
	roottest.Require(t)
	ctx := t.Context()
	bin := demoBinary(t)
	l := lab.Start(t, lab.Options{})
	binDir := l.BinDir // the binaries under test, as New finds them

	out, err := exec.CommandContext(ctx, bin, "demo", "--keep", "--logs", "--bin-dir", binDir).CombinedOutput()
	if err != nil {
		t.Fatalf("podnet-lab demo --keep: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), " 0 failed, 0 skipped") || strings.Contains(string(out), "✗") {
		t.Errorf("podnet-lab demo: a step failed or was skipped:\n%s", out)
	}
	m := regexp.MustCompile(`lab (pn[0-9a-f]{4}) is kept up`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("podnet-lab demo --keep did not say which lab it kept:\n%s", out)
	}
	prefix := string(m[1])
	t.Cleanup(func() { exec.Command(bin, "down", prefix).Run() })
	// The kept lab's processes outlive the demo (they are detached): proxyd
	// still runs on node1.
	if procs, err := os.ReadFile(filepath.Join(filepath.Dir(l.Nodes[0].Cgroup), "podnet-"+prefix+"-node1", "cgroup.procs")); err != nil || len(strings.TrimSpace(string(procs))) == 0 {
		t.Errorf("kept lab %s: no process left on node1 (%q, %v)", prefix, procs, err)
	}
	if got := labNetns(t, prefix); len(got) < 7 {
		t.Errorf("kept lab %s has namespaces %v, want at least 7", prefix, got)
	}
	// A kept lab is not stale: the next lab leaves it alone.
	lab.Start(t, lab.Options{})
	if got := labNetns(t, prefix); len(got) < 7 {
		t.Errorf("kept lab %s lost namespaces to the next New: %v", prefix, got)
	}

	// Only this lab: a developer's own kept lab is not the test's to remove.
	out, err = exec.CommandContext(ctx, bin, "down", prefix).CombinedOutput()
	if err != nil {
		t.Fatalf("podnet-lab down: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "removed lab "+prefix) {
		t.Errorf("podnet-lab down output %q does not name lab %s", out, prefix)
	}
	if got := labNetns(t, prefix); len(got) > 0 {
		t.Errorf("after down, namespaces of %s remain: %v", prefix, got)
	}
	// The kept lab's processes (proxyd, dnsd, echo servers) are gone with
	// their cgroups: the kernel removes only empty ones.
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(l.Nodes[0].Cgroup), "podnet-"+prefix+"-*")); len(left) > 0 {
		t.Errorf("after down, cgroups of %s remain: %v", prefix, left)
	}
}

func TestLabStartProxyd(t *testing.T) {
	roottest.Require(t)
	l := lab.Start(t, lab.Options{})
	n := l.Node("node3")
	if _, err := os.Stat(n.NodeConfigPath()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node config exists before proxyd ran: %v", err)
	}
	p, err := n.StartProxyd(t.Context(), "--proxy-mode", "none")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(readFile(t, n.NodeConfigPath()), `"podCIDR": "10.244.3.0/24"`) {
		t.Errorf("node config proxyd wrote: %s", readFile(t, n.NodeConfigPath()))
	}
	procs := readFile(t, filepath.Join(n.Cgroup, "cgroup.procs"))
	if !strings.Contains(procs, strconv.Itoa(p.Pid())+"\n") {
		t.Errorf("proxyd (pid %d) is not in %s (%q)", p.Pid(), n.Cgroup, procs)
	}
	// A proxyd that cannot start reports why instead of hanging.
	if _, err := l.Node("node2").StartProxyd(t.Context(), "--backend", "carrier-pigeon"); err == nil || !strings.Contains(err.Error(), "carrier-pigeon") {
		t.Errorf("StartProxyd with a bad flag: err = %v, want proxyd's complaint", err)
	}
}

// BenchmarkLab builds and removes the default four-node lab.
func BenchmarkLab(b *testing.B) {
	roottest.Require(b)
	ctx := context.Background()
	for b.Loop() {
		l, err := lab.New(ctx, lab.Options{})
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Close(); err != nil {
			b.Fatal(err)
		}
	}
}
