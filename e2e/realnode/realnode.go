// Package realnode turns a lab node into a real Kubernetes node: containerd
// (Debian's, unpacked without its install scripts) and a kubelet built from
// the Go module proxy, running inside the node's network namespace and a
// private mount and UTS namespace of the node's own (its host name is the
// node's name). The host is left as it was:
//
//   - /etc, /opt, /usr and /var are overlays whose writes land in the node's
//     directory; /var/lib/containerd and /var/lib/kubelet are the node's own
//     directories (containerd's overlay snapshots cannot live on an overlay);
//     /run is a tmpfs; /sys is the namespace's own sysfs with the host's
//     cgroup mounts bound back, the node's own cgroup v2 bound over the
//     cgroup2 root, and a bpffs of its own on /sys/fs/bpf;
//   - the host-wide kernel settings the kubelet writes (vm.overcommit_memory,
//     kernel.panic, …) are ordinary files bound over their /proc/sys entries;
//   - the kubelet's cgroup v1 root is a directory named after the lab run,
//     removed when the node closes.
//
// Every process of the node runs in the lab node's cgroup, so the lab's Close
// ends them all, containers included. What it took: research/real-node.md.
package realnode

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/podnet/podnet/e2e/lab"
)

// Version is the Kubernetes release the node runs (make kube-node).
const Version = "v1.36.3"

// EnvCache is the directory make apiserver and make kube-node cache their
// builds in; /var/cache/podnet by default.
const EnvCache = "PODNET_KUBE_CACHE"

// Binaries are the programs of a real node and its control plane.
type Binaries struct {
	Kubelet, ControllerManager, Scheduler, Kubectl string
	// ContainerdRoot is where Debian's containerd and runc packages are
	// unpacked: usr/bin/containerd, usr/sbin/runc, …
	ContainerdRoot string
}

// Containerd is the daemon, Ctr its client, Runc the OCI runtime; the shim
// is found through PATH (ContainerdRoot/usr/bin).
func (b Binaries) Containerd() string { return filepath.Join(b.ContainerdRoot, "usr/bin/containerd") }
func (b Binaries) Ctr() string        { return filepath.Join(b.ContainerdRoot, "usr/bin/ctr") }
func (b Binaries) Runc() string       { return filepath.Join(b.ContainerdRoot, "usr/sbin/runc") }

// FindBinaries returns the cached builds, or an error saying how to make them.
func FindBinaries() (Binaries, error) {
	dir := os.Getenv(EnvCache)
	if dir == "" {
		dir = "/var/cache/podnet"
	}
	b := Binaries{
		Kubelet:           filepath.Join(dir, "kubelet-"+Version),
		ControllerManager: filepath.Join(dir, "kube-controller-manager-"+Version),
		Scheduler:         filepath.Join(dir, "kube-scheduler-"+Version),
		Kubectl:           filepath.Join(dir, "kubectl-"+Version),
		ContainerdRoot:    filepath.Join(dir, "containerd-debian"),
	}
	for _, p := range []string{b.Kubelet, b.ControllerManager, b.Scheduler, b.Kubectl, b.Containerd(), b.Runc()} {
		if _, err := os.Stat(p); err != nil {
			return b, fmt.Errorf("%w (make kube-node builds it)", err)
		}
	}
	return b, nil
}

// NodeOptions say how a node joins its cluster.
type NodeOptions struct {
	Binaries Binaries
	// Kubeconfig is the kubelet's, reaching the API server from the node.
	Kubeconfig string
	// Images are docker-archive tarballs imported into containerd before
	// the kubelet starts.
	Images []string
	// PauseImage is the sandbox image (one of Images).
	PauseImage string
	// Nameserver is what pods with dnsPolicy Default (and the kubelet's
	// upstream for cluster DNS) are given: an address inside the lab.
	Nameserver string
	// Logf reports progress.
	Logf func(format string, args ...any)
	// NodeIPs are the kubelet's --node-ip, one address per family for a
	// dual-stack node (the first is the primary); empty: the lab node's
	// IPv4 address.
	NodeIPs []netip.Addr
}

// Node is a lab node running containerd and a kubelet.
type Node struct {
	*lab.Node
	o NodeOptions
	// Dir holds the node's overlays, state and configs.
	Dir string
	// CgroupV1 is the kubelet's cgroup root in each v1 hierarchy.
	CgroupV1 string

	holder     *lab.Proc
	holderPid  int
	containerd *lab.Proc
	kubelet    *lab.Proc
	// daemons are the other programs started with StartDaemon.
	daemons map[string]*lab.Proc
}

// hostSysctls are the host-wide settings the kubelet writes; inside the node
// they are files of the node's own.
var hostSysctls = []string{"vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic", "kernel/panic_on_oops", "kernel/keys/root_maxkeys", "kernel/keys/root_maxbytes"}

// Start brings up the node's mount namespace and containerd, imports the
// images and starts the kubelet. On error, the caller's Close of the node
// (and of the lab) removes what was made.
func Start(ctx context.Context, ln *lab.Node, prefix string, o NodeOptions) (*Node, error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	n := &Node{Node: ln, o: o, Dir: filepath.Join(ln.Dir, "real"), CgroupV1: "podnet-" + prefix + "-" + ln.Name}
	if err := n.prepare(); err != nil {
		return n, err
	}
	if err := n.startMountNS(ctx); err != nil {
		return n, err
	}
	if err := n.StartContainerd(ctx); err != nil {
		return n, err
	}
	for _, img := range o.Images {
		if out, err := n.Exec(ctx, o.Binaries.Ctr(), "--address", "/run/containerd/containerd.sock", "-n", "k8s.io", "images", "import", "--all-platforms", img); err != nil {
			return n, fmt.Errorf("import %s: %w\n%s", img, err, out)
		}
	}
	return n, n.StartKubelet(ctx)
}

func (n *Node) path(p ...string) string { return filepath.Join(append([]string{n.Dir}, p...)...) }

// prepare writes the node's directories, configs and stand-in sysctl files,
// and creates its cgroup v1 roots.
func (n *Node) prepare() error {
	dirs := []string{"containerd", "kubelet", "log", "cg", "sysctl"}
	for _, d := range []string{"etc", "opt", "usr", "var"} {
		dirs = append(dirs, "ov/"+d+".up", "ov/"+d+".work")
	}
	for _, d := range dirs {
		if err := os.MkdirAll(n.path(d), 0o755); err != nil {
			return err
		}
	}
	for _, s := range hostSysctls {
		cur, err := os.ReadFile(filepath.Join("/proc/sys", s))
		if err != nil {
			return fmt.Errorf("read %s: %w", s, err)
		}
		if err := os.WriteFile(n.path("sysctl", strings.ReplaceAll(s, "/", ".")), cur, 0o644); err != nil {
			return err
		}
	}
	files := map[string]string{
		"ov/etc.up/resolv.conf": "nameserver " + n.o.Nameserver + "\n",
		"containerd.toml":       n.containerdConfig(),
		"kubelet.yaml":          n.kubeletConfig(),
	}
	for name, text := range files {
		if err := os.WriteFile(n.path(name), []byte(text), 0o644); err != nil {
			return err
		}
	}
	return n.makeCgroupsV1()
}

// makeCgroupsV1 creates the kubelet's cgroup root in each v1 hierarchy; the
// cpuset one needs its parent's cpus and mems before tasks can join.
func (n *Node) makeCgroupsV1() error {
	for _, root := range lab.CgroupV1Roots() {
		d := filepath.Join(root, n.CgroupV1)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("create cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			v, err := os.ReadFile(filepath.Join(root, f))
			if errors.Is(err, os.ErrNotExist) {
				continue // not the cpuset hierarchy
			}
			if err == nil {
				err = os.WriteFile(filepath.Join(d, f), v, 0o644)
			}
			if err != nil {
				return fmt.Errorf("cgroup %s: %w", f, err)
			}
		}
	}
	return nil
}

// mountScript sets up the node's mount namespace and then holds it open.
// It runs in the host's mount namespace view (so the cgroup mounts are
// there to keep) but in the node's network namespace.
func (n *Node) mountScript() string {
	d := n.Dir
	var b strings.Builder
	fmt.Fprintf(&b, "set -e\n")
	fmt.Fprintf(&b, "mount --rbind /sys/fs/cgroup %s/cg\n", d)
	fmt.Fprintf(&b, "mount -t sysfs sysfs /sys\n")
	fmt.Fprintf(&b, "mount --rbind %s/cg /sys/fs/cgroup\n", d)
	// The node's cgroup v2 is its cgroup2 root: what the node takes for
	// the whole machine's (ebpf mode attaches its socket programs there,
	// deploy/ebpf) holds the node's processes and nothing of the host's.
	fmt.Fprintf(&b, "mount --bind %s %s\n", n.Node.Cgroup, filepath.Dir(n.Node.Cgroup))
	// A bpffs of the node's own, shared, as systemd mounts it on a real
	// node: a DaemonSet's Bidirectional mount of /sys/fs/bpf needs it so.
	// Its pins die with the node's mount namespace.
	fmt.Fprintf(&b, "mount -t bpf bpf /sys/fs/bpf\n")
	fmt.Fprintf(&b, "mount --make-shared /sys/fs/bpf\n")
	fmt.Fprintf(&b, "mount -t tmpfs tmpfs /run\n")
	for _, o := range []string{"etc", "opt", "usr", "var"} {
		fmt.Fprintf(&b, "mount -t overlay overlay -o lowerdir=/%s,upperdir=%s/ov/%s.up,workdir=%s/ov/%s.work /%s\n", o, d, o, d, o, o)
	}
	fmt.Fprintf(&b, "mkdir -p /var/lib/containerd /var/lib/kubelet /var/log /opt/cni/bin /etc/cni/net.d /lib/modules\n")
	fmt.Fprintf(&b, "mount --bind %s/containerd /var/lib/containerd\n", d)
	fmt.Fprintf(&b, "mount --bind %s/kubelet /var/lib/kubelet\n", d)
	fmt.Fprintf(&b, "mount --make-rshared /var/lib/kubelet\n")
	fmt.Fprintf(&b, "mount --bind %s/log /var/log\n", d)
	for _, s := range hostSysctls {
		fmt.Fprintf(&b, "mount --bind %s/sysctl/%s /proc/sys/%s\n", d, strings.ReplaceAll(s, "/", "."), s)
	}
	// A node fresh from boot forwards nothing (a new namespace inherits the
	// host's setting): the DaemonSet has to turn it on itself.
	fmt.Fprintf(&b, "echo 0 > /proc/sys/net/ipv4/ip_forward\n")
	// The node's own host name, in a UTS namespace of its own, as a real
	// machine has: hostNetwork pods share it (their hostname is the node's
	// name, which specs compare with the Node).
	fmt.Fprintf(&b, "hostname %s\n", n.Name)
	fmt.Fprintf(&b, "echo $$ > %s/mountns.pid\n", d)
	fmt.Fprintf(&b, "exec sleep infinity\n")
	return b.String()
}

// startMountNS starts the process that holds the node's mount and UTS
// namespaces.
// ip netns exec (through the lab) gives the namespace's /sys, which hides
// the host's cgroup mounts: nsenter back into this process's mount
// namespace first, then unshare a private one.
func (n *Node) startMountNS(ctx context.Context) error {
	p, err := n.Node.Start("mountns", "nsenter", "--mount=/proc/"+strconv.Itoa(os.Getpid())+"/ns/mnt", "--",
		"unshare", "--mount", "--uts", "--propagation", "private", "sh", "-c", n.mountScript())
	if err != nil {
		return err
	}
	n.holder = p
	deadline := time.Now().Add(30 * time.Second)
	for {
		if b, err := os.ReadFile(n.path("mountns.pid")); err == nil && strings.HasSuffix(string(b), "\n") {
			n.holderPid, err = strconv.Atoi(strings.TrimSpace(string(b)))
			return err
		}
		select {
		case <-p.Done():
			return fmt.Errorf("node %s: mount namespace setup failed: %s", n.Name, p.Output())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("node %s: mount namespace not ready after 30s: %s", n.Name, p.Output())
		}
	}
}

// inNode prefixes a command so it runs in the node's mount and UTS
// namespaces (the lab already puts it in the node's network namespace and
// cgroup), with the Debian containerd's binaries on PATH.
func (n *Node) inNode(args ...string) []string {
	path := filepath.Join(n.o.Binaries.ContainerdRoot, "usr/bin") + ":" + filepath.Join(n.o.Binaries.ContainerdRoot, "usr/sbin") + ":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	return append([]string{"nsenter", "-t", strconv.Itoa(n.holderPid), "-m", "-u", "--", "env", "PATH=" + path}, args...)
}

// Exec runs a command inside the node (network, mount and UTS namespaces).
func (n *Node) Exec(ctx context.Context, args ...string) (string, error) {
	return n.Node.Exec(ctx, n.inNode(args...)...)
}

// StartContainerd starts containerd and waits for its socket.
func (n *Node) StartContainerd(ctx context.Context) error {
	p, err := n.Node.Start("containerd", n.inNode(n.o.Binaries.Containerd(), "--config", n.path("containerd.toml"))...)
	if err != nil {
		return err
	}
	n.containerd = p
	return n.waitFor(ctx, p, "containerd", func() bool {
		_, err := n.Exec(ctx, n.o.Binaries.Ctr(), "--address", "/run/containerd/containerd.sock", "version")
		return err == nil
	})
}

// StartKubelet starts the kubelet; it registers the node by itself.
func (n *Node) StartKubelet(ctx context.Context) error {
	p, err := n.Node.Start("kubelet", n.inNode(n.o.Binaries.Kubelet,
		"--config="+n.path("kubelet.yaml"),
		"--kubeconfig="+n.o.Kubeconfig,
		"--hostname-override="+n.Name,
		"--node-ip="+n.nodeIPs(),
		// A label a kubelet may set on its own Node (NodeRestriction
		// allows topology.kubernetes.io/zone): the topology and
		// trafficDistribution specs skip without zones.
		"--node-labels=topology.kubernetes.io/zone="+n.Zone,
		"--v=1",
	)...)
	if err != nil {
		return err
	}
	n.kubelet = p
	return nil
}

// nodeIPs is the kubelet's --node-ip: NodeOptions.NodeIPs, or the lab
// node's IPv4 address.
func (n *Node) nodeIPs() string {
	if len(n.o.NodeIPs) == 0 {
		return n.IP.String()
	}
	ips := make([]string, len(n.o.NodeIPs))
	for i, a := range n.o.NodeIPs {
		ips[i] = a.String()
	}
	return strings.Join(ips, ",")
}

// StartDaemon starts another program of the node (say kube-proxy) the way
// containerd and the kubelet run: in the node's network and mount
// namespaces and its cgroup, so Close ends it too; Logs shows its output.
func (n *Node) StartDaemon(name string, args ...string) (*lab.Proc, error) {
	p, err := n.Node.Start(name, n.inNode(args...)...)
	if err != nil {
		return nil, err
	}
	if n.daemons == nil {
		n.daemons = map[string]*lab.Proc{}
	}
	n.daemons[name] = p
	return p, nil
}

// KillKubelet and KillContainerd crash the daemons (SIGKILL); containers
// keep running under their shims, as on a node whose daemons restart.
func (n *Node) KillKubelet()    { kill(&n.kubelet) }
func (n *Node) KillContainerd() { kill(&n.containerd) }

// KillPod SIGKILLs every process of the pod with the given UID on this
// node, its containers and their containerd shim, as when a node loses them
// (the OOM killer, a crash) while containerd is down: the sandbox is gone
// but its network namespace, veth and address are still there. It returns
// how many processes it killed; none is an error.
func (n *Node) KillPod(uid string) (int, error) {
	procs, err := filepath.Glob("/proc/[0-9]*")
	if err != nil {
		return 0, err
	}
	// The kubelet's cgroupfs layout: ROOT/kubepods/[QOS/]podUID/CONTAINER.
	inPod := "/" + n.CgroupV1 + "/"
	podDir := "/pod" + uid + "/"
	var pids []int
	ids := map[string]bool{}
	for _, p := range procs {
		cg, err := os.ReadFile(filepath.Join(p, "cgroup"))
		if err != nil {
			continue // gone meanwhile
		}
		for _, line := range strings.Split(string(cg), "\n") {
			i := strings.Index(line, podDir)
			if i < 0 || !strings.Contains(line, inPod) {
				continue
			}
			if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
				pids = append(pids, pid)
			}
			ids[strings.Trim(line[i+len(podDir):], "/")] = true
			break
		}
	}
	// The shim is containerd's child, named by its sandbox's (the pause
	// container's) ID.
	for _, p := range procs {
		cmd, err := os.ReadFile(filepath.Join(p, "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmd), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		for i, a := range args[:len(args)-1] {
			if a == "-id" && ids[args[i+1]] {
				if pid, err := strconv.Atoi(filepath.Base(p)); err == nil {
					pids = append([]int{pid}, pids...)
				}
			}
		}
	}
	if len(pids) == 0 {
		return 0, fmt.Errorf("node %s: no process of pod %s", n.Name, uid)
	}
	for _, pid := range pids {
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return 0, fmt.Errorf("kill %d of pod %s: %w", pid, uid, err)
		}
	}
	return len(pids), nil
}

func kill(p **lab.Proc) {
	if *p != nil {
		(*p).Kill()
		*p = nil
	}
}

// Logs returns the tails of containerd's and the kubelet's output.
func (n *Node) Logs() string {
	var b strings.Builder
	procs := map[string]*lab.Proc{"containerd": n.containerd, "kubelet": n.kubelet, "mountns": n.holder}
	for name, p := range n.daemons {
		procs[name] = p
	}
	for name, p := range procs {
		if p != nil {
			out := p.Output()
			fmt.Fprintf(&b, "=== %s/%s\n%s\n", n.Name, name, out[max(0, len(out)-6000):])
		}
	}
	return b.String()
}

func (n *Node) waitFor(ctx context.Context, p *lab.Proc, what string, ok func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for !ok() {
		select {
		case <-p.Done():
			return fmt.Errorf("node %s: %s exited: %s", n.Name, what, p.Output())
		case <-ctx.Done():
			return fmt.Errorf("node %s: %s not up: %v\n%s", n.Name, what, ctx.Err(), p.Output())
		case <-time.After(200 * time.Millisecond):
		}
	}
	return nil
}

// Close ends every process of the node (kubelet, containerd, shims,
// containers: the whole node cgroup) and removes its cgroup v1 roots,
// deepest first. The lab's Close removes the rest.
func (n *Node) Close() error {
	n.KillKubelet()
	if err := os.WriteFile(filepath.Join(n.Cgroup, "cgroup.kill"), []byte("1"), 0o644); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kill node %s: %w", n.Name, err)
	}
	var errs []error
	for _, root := range lab.CgroupV1Roots() {
		if err := lab.RemoveCgroupTree(filepath.Join(root, n.CgroupV1)); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
