package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// LabBinary is the lab's own binary in BinDir; it carries the echo server
// and prober that run inside pods and nodes.
const LabBinary = "podnet-lab"

// ProbeTimeout bounds one Probe.
const ProbeTimeout = 2 * time.Second

// echoReadyTimeout bounds how long StartEcho waits for the listeners.
const echoReadyTimeout = 5 * time.Second

func (l *Lab) labBinary() string { return filepath.Join(l.BinDir, LabBinary) }

// StartEcho runs an echo server (see EchoOptions) in the pod and returns
// once it listens. Name defaults to the pod's name.
func (p *Pod) StartEcho(o EchoOptions) (*Proc, error) {
	if o.Name == "" {
		o.Name = p.Name
	}
	return startEcho(p.Node.lab.labBinary(), o, func(args ...string) (*Proc, error) { return p.Start("echo", args...) })
}

// StartEcho runs an echo server (see EchoOptions) on the node, in its host
// network, and returns once it listens. Name defaults to the node's name.
func (n *Node) StartEcho(o EchoOptions) (*Proc, error) {
	if o.Name == "" {
		o.Name = n.Name
	}
	return startEcho(n.lab.labBinary(), o, func(args ...string) (*Proc, error) { return n.Start("echo", args...) })
}

func startEcho(bin string, o EchoOptions, start func(args ...string) (*Proc, error)) (*Proc, error) {
	if len(o.HTTP)+len(o.TCP)+len(o.UDP) == 0 {
		return nil, fmt.Errorf("start echo server %s: no listener", o.Name)
	}
	p, err := start(append([]string{bin}, o.Args()...)...)
	if err != nil {
		return nil, err
	}
	deadline := time.After(echoReadyTimeout)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for !strings.Contains(p.Output(), EchoReady) {
		select {
		case <-p.Done():
			return nil, fmt.Errorf("echo server %s exited: %v: %s", o.Name, p.Wait(context.Background()), strings.TrimSpace(p.Output()))
		case <-deadline:
			p.kill()
			return nil, fmt.Errorf("echo server %s not ready after %v: %s", o.Name, echoReadyTimeout, strings.TrimSpace(p.Output()))
		case <-tick.C:
		}
	}
	return p, nil
}

// Probe asks the echo server at addr ("ip:port") over proto ("http", "tcp"
// or "udp") from inside the pod, with a real process in the node's cgroup,
// and returns the answer: "<server name> <client ip:port>".
func (p *Pod) Probe(ctx context.Context, proto, addr string) (string, error) {
	return probeWith(ctx, p.Node.lab, proto, addr, p.Exec)
}

// Probe is Pod.Probe from the node's host network.
func (n *Node) Probe(ctx context.Context, proto, addr string) (string, error) {
	return probeWith(ctx, n.lab, proto, addr, n.Exec)
}

func probeWith(ctx context.Context, l *Lab, proto, addr string, exec func(context.Context, ...string) (string, error)) (string, error) {
	out, err := exec(ctx, l.labBinary(), "probe", "--timeout", ProbeTimeout.String(), proto, addr)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(out), nil
}

// RequestRates runs TCP_RR (`podnet-lab rr`, see RequestResponse) from
// inside the pod, with a real process in the node's cgroup, against the
// echo servers at addrs for d each, in turns of 250 ms, and returns the
// round trips per second of each.
func (p *Pod) RequestRates(ctx context.Context, addrs []string, d time.Duration) ([]float64, error) {
	out, err := p.Exec(ctx, append([]string{p.Node.lab.labBinary(), "rr", "--duration", d.String()}, addrs...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(out))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(addrs) {
		return nil, fmt.Errorf("podnet-lab rr: unexpected output %q", out)
	}
	rates := make([]float64, len(addrs))
	for i, line := range lines {
		var addr string
		var n int
		var secs float64
		if _, err := fmt.Sscanf(line, "%s %d round trips in %fs", &addr, &n, &secs); err != nil || addr != addrs[i] || secs <= 0 {
			return nil, fmt.Errorf("podnet-lab rr: unexpected output %q", out)
		}
		rates[i] = float64(n) / secs
	}
	return rates, nil
}

// ProxydReadyTimeout bounds how long StartProxyd waits for the node config.
// proxyd writes it once the whole cluster state is read: a benchmark
// holding 10,000 Services on a loaded machine raises it.
var ProxydReadyTimeout = 10 * time.Second

// StartProxyd runs the node agent (BinDir/proxyd) on the node, wired to the
// lab: --node-name, --state-dir and --node-config point at the node and the
// lab's state dir; args come after them (and so override them). It returns
// once proxyd has written the node config, the sign that the CNI plugin can
// add pods, or with proxyd's output if it exits or the config does not
// appear within ProxydReadyTimeout.
func (n *Node) StartProxyd(ctx context.Context, args ...string) (*Proc, error) {
	l := n.lab
	argv := append([]string{
		filepath.Join(l.BinDir, "proxyd"),
		"--node-name", n.Name,
		"--state-dir", l.StateDir(),
		"--node-config", n.NodeConfigPath(),
		// In every mode: iptables mode removes ebpf mode's state at start,
		// and must find the lab's, never the host's.
		"--bpf-cgroup", n.BPFCgroup(),
		"--bpf-pin-dir", n.BPFPinDir(),
	}, args...)
	p, err := n.Start("proxyd", argv...)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, ProxydReadyTimeout)
	defer cancel()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		if _, err := os.Stat(n.NodeConfigPath()); err == nil {
			return p, nil
		}
		select {
		case <-p.Done():
			return nil, fmt.Errorf("proxyd on %s exited before writing %s: %v\n%s", n.Name, n.NodeConfigPath(), p.Wait(ctx), strings.TrimSpace(p.Output()))
		case <-ctx.Done():
			p.kill()
			return nil, fmt.Errorf("proxyd on %s: no node config after %v: %w\n%s", n.Name, ProxydReadyTimeout, ctx.Err(), strings.TrimSpace(p.Output()))
		case <-tick.C:
		}
	}
}
