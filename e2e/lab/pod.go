package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// PluginName is the CNI plugin's binary name in BinDir (the conflist's type).
const PluginName = "podnet"

// Pod is a network namespace attached to a node by the CNI plugin.
type Pod struct {
	Name        string
	NS          string // netns name: <prefix>-<node>-<pod>
	ContainerID string
	IfName      string
	// IP is the pod's first address (IPv4 first); IPs holds one per
	// family.
	IP   netip.Addr
	IPs  []netip.Addr
	Node *Node
	// Result is what the plugin returned on ADD.
	Result *types100.Result

	rt *libcni.RuntimeConf
}

// NetworkConfList is the conflist the lab hands the plugin for node n, in
// the shape `podnet install` writes to /etc/cni/net.d, with the paths pointed
// into the node's directory.
func (n *Node) NetworkConfList() []byte {
	conf := map[string]any{
		"cniVersion": "1.1.0",
		"name":       "podnet",
		"plugins": []any{map[string]any{
			"type":       PluginName,
			"nodeConfig": n.NodeConfigPath(),
			"dataDir":    filepath.Join(n.Dir, "ipam"),
			"logFile":    filepath.Join(n.Dir, "cni.log"),
		},
			// as `podnet install` chains it, for hostPorts
			map[string]any{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}},
		},
	}
	data, _ := json.Marshal(conf) // maps of strings always encode
	return data
}

// cni returns a libcni client as a container runtime on node n holds it:
// plugins from BinDir, results cached in the node's directory. stderr
// collects what the plugin printed there.
func (n *Node) cni(stderr *syncBuffer) *libcni.CNIConfig {
	exec := &invoke.DefaultExec{RawExec: &invoke.RawExec{Stderr: stderr}, PluginDecoder: version.PluginDecoder{}}
	return libcni.NewCNIConfigWithCacheDir([]string{n.lab.BinDir}, filepath.Join(n.Dir, "cni-cache"), exec)
}

// PortMapping is a pod's hostPort, as a runtime passes it to the plugins
// with the portMappings capability.
type PortMapping struct {
	HostPort      int    `json:"hostPort"`
	ContainerPort int    `json:"containerPort"`
	Protocol      string `json:"protocol"` // "tcp" or "udp"
}

// AddPod creates the namespace of pod name and attaches it to the node by
// calling the CNI plugin with ADD, from inside the node's namespace, the way
// a container runtime does. The pod's interface is eth0; ports are its
// hostPorts.
func (n *Node) AddPod(ctx context.Context, name string, ports ...PortMapping) (*Pod, error) {
	if err := validName("pod name", name); err != nil {
		return nil, err
	}
	l := n.lab
	p := &Pod{Name: name, NS: n.NS + "-" + name, IfName: "eth0", Node: n}
	p.ContainerID = p.NS
	p.rt = &libcni.RuntimeConf{
		ContainerID: p.ContainerID,
		NetNS:       netnsPath(p.NS),
		IfName:      p.IfName,
		// What containerd passes; IgnoreUnknown lets plugins skip the rest.
		Args: [][2]string{
			{"IgnoreUnknown", "1"},
			{"K8S_POD_NAMESPACE", "default"},
			{"K8S_POD_NAME", name},
			{"K8S_POD_INFRA_CONTAINER_ID", p.ContainerID},
		},
	}
	if len(ports) > 0 {
		p.rt.CapabilityArgs = map[string]any{"portMappings": ports}
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, errors.New("add pod: lab is closed")
	}
	// Registered before the namespace exists so Close removes it whatever
	// happens next.
	l.pods = append(l.pods, p)
	l.mu.Unlock()

	if err := createNetns(ctx, p.NS); err != nil {
		l.forgetPod(p)
		return nil, err
	}
	if err := setLinkUp(p.NS, "lo"); err != nil {
		return nil, errors.Join(err, l.removePodNS(p))
	}
	conf, err := libcni.ConfListFromBytes(n.NetworkConfList())
	if err != nil {
		return nil, errors.Join(fmt.Errorf("parse conflist: %w", err), l.removePodNS(p))
	}
	var stderr syncBuffer
	var res types.Result
	err = ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		var err error
		res, err = n.cni(&stderr).AddNetworkList(ctx, conf, p.rt)
		return err
	})
	if err != nil {
		err = fmt.Errorf("add pod %s on %s: CNI ADD: %w%s", name, n.Name, err, stderrNote(&stderr))
		// A runtime tears a sandbox down with DEL after a failed ADD
		// (containerd does); a plugin must accept that.
		return nil, errors.Join(err, n.delPod(ctx, p))
	}
	r, err := types100.NewResultFromResult(res)
	if err != nil {
		return nil, errors.Join(fmt.Errorf("add pod %s: convert CNI result: %w", name, err), n.delPod(ctx, p))
	}
	p.Result = r
	for _, ipc := range r.IPs {
		if a, ok := netip.AddrFromSlice(ipc.Address.IP); ok {
			p.IPs = append(p.IPs, a.Unmap())
		}
	}
	// One per family of the node config (a proxyd serving fewer families
	// than the lab, as in ebpf mode, gives fewer).
	if len(p.IPs) == 0 {
		return nil, errors.Join(fmt.Errorf("add pod %s: CNI result has no address: %s", name, resultJSON(r)), n.delPod(ctx, p))
	}
	p.IP = p.IPs[0]
	return p, nil
}

// IPOf is the pod's address of family f (invalid if it has none).
func (p *Pod) IPOf(f ipfamily.Family) netip.Addr {
	for _, a := range p.IPs {
		if f.Has(a) {
			return a
		}
	}
	return netip.Addr{}
}

// DeletePod calls the CNI plugin with DEL for the pod and removes its
// namespace.
func (n *Node) DeletePod(ctx context.Context, p *Pod) error {
	return n.delPod(ctx, p)
}

func (n *Node) delPod(ctx context.Context, p *Pod) error {
	conf, err := libcni.ConfListFromBytes(n.NetworkConfList())
	if err != nil {
		return fmt.Errorf("parse conflist: %w", err)
	}
	var stderr syncBuffer
	err = ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		return n.cni(&stderr).DelNetworkList(ctx, conf, p.rt)
	})
	if err != nil {
		// Keep the namespace: the caller may retry, Close removes it.
		return fmt.Errorf("delete pod %s on %s: CNI DEL: %w%s", p.Name, n.Name, err, stderrNote(&stderr))
	}
	return n.lab.removePodNS(p)
}

// GC calls the CNI plugin with GC for node n, as a runtime does after a
// restart: every attachment not in valid is released.
func (n *Node) GC(ctx context.Context, valid []types.GCAttachment) error {
	conf, err := libcni.ConfListFromBytes(n.NetworkConfList())
	if err != nil {
		return fmt.Errorf("parse conflist: %w", err)
	}
	var stderr syncBuffer
	err = ns.WithNetNSPath(n.NSPath(), func(ns.NetNS) error {
		return n.cni(&stderr).GCNetworkList(ctx, conf, &libcni.GCArgs{ValidAttachments: valid})
	})
	if err != nil {
		return fmt.Errorf("CNI GC on %s: %w%s", n.Name, err, stderrNote(&stderr))
	}
	return nil
}

func (l *Lab) removePodNS(p *Pod) error {
	if err := deleteNetns(p.NS); err != nil {
		return err
	}
	l.forgetPod(p)
	return nil
}

func (l *Lab) forgetPod(p *Pod) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.pods = slices.DeleteFunc(l.pods, func(q *Pod) bool { return q == p })
}

// Pods returns the pods the lab holds now.
func (l *Lab) Pods() []*Pod {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.pods)
}

// SetResolvConf gives the pod its own /etc/resolv.conf, as the kubelet
// does (ClusterFirst: nameserver 10.96.0.10, the cluster search path): every
// process started by Exec or Start sees it.
func (p *Pod) SetResolvConf(text string) error { return setResolvConf(p.NS, text) }

// SetResolvConf gives the node's processes their own /etc/resolv.conf, so
// that dnsd on the node forwards to an upstream inside the lab, never to the
// host's resolver.
func (n *Node) SetResolvConf(text string) error { return setResolvConf(n.NS, text) }

// NSPath is the path of the pod's network namespace.
func (p *Pod) NSPath() string { return netnsPath(p.NS) }

// Exec runs a command in the pod's namespace (and its node's cgroup) and
// returns its output; on failure the error includes the output.
func (p *Pod) Exec(ctx context.Context, args ...string) (string, error) {
	return execIn(ctx, p.NS, p.Node.Cgroup, args)
}

// Start runs a command in the background in the pod's namespace and its
// node's cgroup.
func (p *Pod) Start(name string, args ...string) (*Proc, error) {
	return p.Node.lab.startIn(p.Node.Name+"/"+p.Name+"/"+name, p.NS, p.Node.Cgroup, args)
}

// Ping pings dst from the pod; see Ping.
func (p *Pod) Ping(ctx context.Context, dst netip.Addr) (time.Duration, error) {
	return Ping(ctx, p.NSPath(), dst)
}

// Ping pings dst from the node; see Ping.
func (n *Node) Ping(ctx context.Context, dst netip.Addr) (time.Duration, error) {
	return Ping(ctx, n.NSPath(), dst)
}

// PluginSupportsADD reports, by asking the plugin in binDir for its VERSION
// as a runtime does, whether it speaks CNI 1.1.0; nil means yes.
func PluginSupportsADD(ctx context.Context, binDir string) error {
	path := filepath.Join(binDir, PluginName)
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("CNI plugin: %w", err)
	}
	cmd := exec.CommandContext(ctx, path)
	cmd.Env = append(os.Environ(), "CNI_COMMAND=VERSION")
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.1.0"}`)
	out, err := cmd.Output()
	if err != nil {
		return fmt.Errorf("CNI plugin %s VERSION: %w", path, err)
	}
	info, err := (&version.PluginDecoder{}).Decode(out)
	if err != nil {
		return fmt.Errorf("CNI plugin %s VERSION: %w", path, err)
	}
	if !slices.Contains(info.SupportedVersions(), "1.1.0") {
		return fmt.Errorf("CNI plugin %s supports %v, not 1.1.0", path, info.SupportedVersions())
	}
	return nil
}

func stderrNote(b *syncBuffer) string {
	if s := strings.TrimSpace(b.String()); s != "" {
		return " (stderr: " + s + ")"
	}
	return ""
}

func resultJSON(r *types100.Result) string {
	data, _ := json.Marshal(r)
	return string(data)
}

// setLinkUp sets a link up inside the named namespace.
func setLinkUp(nsName, link string) error {
	h, err := openNS(nsName)
	if err != nil {
		return err
	}
	defer h.close()
	return h.up(link)
}
