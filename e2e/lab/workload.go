package lab

import (
	"context"
	"fmt"
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
