package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/e2e/lab"
)

type demoOptions struct {
	keep      bool
	logs      bool // print the lab's logs after a failed step
	binDir    string
	proxyMode string // proxyd --proxy-mode
}

// step is one thing the demo shows. run prints what it saw to d.out and
// returns an error when something that should work did not, or a skipError
// when a prerequisite (a binary that cannot do it yet) is missing.
type step struct {
	title string
	run   func(ctx context.Context, d *demo) error
}

// steps is the demo, in order. To show more, append a step; what earlier
// steps set up is in demo (d.pods, d.proxyd).
var steps = []step{
	{"nodes reach each other and the outside over the underlay", nodeMatrix},
	{"proxyd on every node: node config and routes to the other nodes' pods", startProxyd},
	{"two pods on node1 reach each other and their node over cbr0", podsOnOneNode},
	{"a pod on every node: pod ↔ pod across nodes, and out to the internet", podsAcrossNodes},
	{"a Service: ClusterIP from a pod, NodePort from the outside", service},
	{"the same Service in the other proxy mode (proxyd restarted on every node)", switchMode},
	{"cluster DNS: dnsd behind 10.96.0.10, dig from a pod", clusterDNS},
}

type demo struct {
	lab       *lab.Lab
	out       io.Writer
	proxyMode string
	pods      []*lab.Pod
	// proxyd is set once proxyd runs on every node; procs are those
	// proxyds.
	proxyd bool
	procs  []*lab.Proc
	// backends are the Service's endpoints, set by the Service step.
	backends []*lab.Pod
}

// skipError marks a step that could not run yet; it does not fail the demo.
type skipError struct{ reason string }

func (e skipError) Error() string { return "skipped: " + e.reason }

func runDemo(ctx context.Context, out io.Writer, o demoOptions) error {
	start := time.Now()
	// Dual-stack: every matrix of pods is shown for IPv6 beside IPv4.
	l, err := lab.New(ctx, lab.Options{BinDir: o.binDir, Detached: o.keep, Families: []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6}})
	if err != nil {
		return fmt.Errorf("build lab: %w", err)
	}
	kept := false
	defer func() {
		if !kept {
			if err := l.Close(); err != nil {
				fmt.Fprintf(os.Stderr, "podnet-lab: tear down lab %s: %v\n", l.Prefix, err)
			}
		}
	}()
	printLab(out, l, time.Since(start))

	d := &demo{lab: l, out: out, proxyMode: o.proxyMode}
	failed, skipped := 0, 0
	for i, s := range steps {
		if ctx.Err() != nil {
			fmt.Fprintln(out, "\ninterrupted")
			return ctx.Err()
		}
		fmt.Fprintf(out, "\n[%d/%d] %s\n", i+1, len(steps), s.title)
		stepStart := time.Now()
		err := s.run(ctx, d)
		took := time.Since(stepStart).Round(time.Millisecond)
		var skip skipError
		switch {
		case errors.As(err, &skip):
			skipped++
			fmt.Fprintf(out, "  - %v\n", err)
		case err != nil:
			failed++
			fmt.Fprintf(out, "  ✗ %v (%v)\n", err, took)
			if logs := l.Logs(); o.logs && logs != "" {
				fmt.Fprintf(out, "  lab logs:\n%s\n", indent(logs, "    "))
			}
		default:
			fmt.Fprintf(out, "  ✓ ok (%v)\n", took)
		}
	}
	fmt.Fprintf(out, "\n%d steps: %d ok, %d failed, %d skipped\n", len(steps), len(steps)-failed-skipped, failed, skipped)
	if failed > 0 && !o.logs {
		fmt.Fprintln(out, "(--logs prints what every process of the lab said; --keep leaves the lab up to look around)")
	}

	if o.keep {
		if err := l.Keep(); err != nil {
			return fmt.Errorf("keep lab: %w", err)
		}
		kept = true
		printKept(out, l, d)
	} else {
		fmt.Fprintf(out, "tearing down lab %s\n", l.Prefix)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d demo steps failed", failed, len(steps))
	}
	return nil
}

func printLab(out io.Writer, l *lab.Lab, took time.Duration) {
	fmt.Fprintf(out, "podnet lab %s: %d nodes on %d segments, built in %v\n\n", l.Prefix, len(l.Nodes), len(l.Segments), took.Round(time.Millisecond))
	fmt.Fprintf(out, "  %-8s %-15s %-7s %-15s %s\n", "node", "address", "zone", "pod CIDR", "netns")
	for _, n := range l.Nodes {
		fmt.Fprintf(out, "  %-8s %-15s %-7s %-15s %s\n", n.Name, n.IP, n.Zone, n.PodCIDR, n.NS)
	}
	var legs []string
	for _, s := range l.Segments {
		legs = append(legs, fmt.Sprintf("%s (%s)", s.Gateway, s.Subnet))
	}
	fmt.Fprintf(out, "  router   %s, netns %s\n", strings.Join(legs, ", "), l.Router)
	fmt.Fprintf(out, "  outside  %s, netns %s\n", l.OutsideIP, l.Outside)
}

func printKept(out io.Writer, l *lab.Lab, d *demo) {
	fmt.Fprintf(out, "\nlab %s is kept up. Enter a node or pod with\n", l.Prefix)
	for _, n := range l.Nodes {
		fmt.Fprintf(out, "  ip netns exec %s bash    # %s\n", n.NS, n.Name)
	}
	for _, p := range d.pods {
		fmt.Fprintf(out, "  ip netns exec %s bash    # pod %s on %s, %s\n", p.NS, p.Name, p.Node.Name, p.IP)
	}
	fmt.Fprintf(out, "control plane state: %s\nremove it with: make demo-down   (or ./bin/podnet-lab down)\n", l.StateDir())
}

// endpoint is a row or column of a ping matrix.
type endpoint struct {
	name   string
	nsPath string // empty: a column only
	ip     netip.Addr
}

func nodeEndpoints(l *lab.Lab) []endpoint {
	var eps []endpoint
	for _, n := range l.Nodes {
		eps = append(eps, endpoint{n.Name, n.NSPath(), n.IP})
	}
	return eps
}

// nodeMatrix: every node pings every node and the outside.
func nodeMatrix(ctx context.Context, d *demo) error {
	rows := nodeEndpoints(d.lab)
	cols := append(nodeEndpoints(d.lab), endpoint{name: "outside", ip: d.lab.OutsideIP})
	return pingMatrix(ctx, d.out, rows, cols)
}

// startProxyd starts proxyd on every node, all at once, and shows the node
// config each one wrote for the CNI plugin.
func startProxyd(ctx context.Context, d *demo) error {
	l := d.lab
	if _, err := os.Stat(filepath.Join(l.BinDir, "proxyd")); err != nil {
		return skipError{fmt.Sprintf("no proxyd binary (%v)", err)}
	}
	mode := d.proxyMode
	var err error
	if d.procs, err = startProxydEverywhere(ctx, l, mode); err != nil {
		return err
	}
	for _, n := range l.Nodes {
		c, err := nodeconfig.Read(n.NodeConfigPath())
		if err != nil {
			return err
		}
		fmt.Fprintf(d.out, "  %s: proxyd --proxy-mode %s wrote podCIDRs %v, MTU %d\n", n.Name, mode, c.Pods(), c.MTU)
	}
	d.proxyd = true
	return nil
}

// startProxydEverywhere starts proxyd on every node at once, serving the
// lab's families in either mode.
func startProxydEverywhere(ctx context.Context, l *lab.Lab, mode string) ([]*lab.Proc, error) {
	var cidrs []string
	for _, p := range l.ClusterCIDRs() {
		cidrs = append(cidrs, p.String())
	}
	args := []string{"--proxy-mode", mode, "--cluster-cidr", strings.Join(cidrs, ","), "--service-cluster-ip-range", "10.96.0.0/12,fd00:10:96::/112"}
	errs := make([]error, len(l.Nodes))
	procs := make([]*lab.Proc, len(l.Nodes))
	var wg sync.WaitGroup
	for i, n := range l.Nodes {
		wg.Go(func() {
			procs[i], errs[i] = n.StartProxyd(ctx, args...)
		})
	}
	wg.Wait()
	return procs, errors.Join(errs...)
}

// podsOnOneNode adds two pods to node1 through the CNI plugin and lets them
// ping each other and their node.
func podsOnOneNode(ctx context.Context, d *demo) error {
	l := d.lab
	if err := lab.PluginSupportsADD(ctx, l.BinDir); err != nil {
		return skipError{fmt.Sprintf("the CNI plugin cannot add pods yet (%v)", err)}
	}
	n := l.Nodes[0]
	if !d.proxyd {
		// No proxyd wrote the node config: write it as proxyd would.
		if err := n.WriteNodeConfig(); err != nil {
			return err
		}
	}
	var rows []endpoint
	for _, name := range []string{"a", "b"} {
		p, err := d.addPod(ctx, n, name)
		if err != nil {
			return err
		}
		rows = append(rows, endpoint{p.Node.Name + "/" + p.Name, p.NSPath(), p.IP})
	}
	cols := append(rows[:len(rows):len(rows)], endpoint{name: n.Name, ip: n.IP})
	return pingMatrix(ctx, d.out, rows, cols)
}

// podsAcrossNodes adds a pod to every other node; every pod pings every pod
// (host-gw between nodes on one segment, VXLAN to the other segment) and the
// outside (masqueraded to its node's address).
func podsAcrossNodes(ctx context.Context, d *demo) error {
	l := d.lab
	if !d.proxyd || len(d.pods) == 0 {
		return skipError{"needs proxyd on every node and the pods of the step before"}
	}
	rows := []endpoint{}
	for _, p := range d.pods[:1] {
		rows = append(rows, endpoint{p.Node.Name + "/" + p.Name, p.NSPath(), p.IP})
	}
	for _, n := range l.Nodes[1:] {
		p, err := d.addPod(ctx, n, "a")
		if err != nil {
			return err
		}
		rows = append(rows, endpoint{p.Node.Name + "/" + p.Name, p.NSPath(), p.IP})
	}
	n := l.Nodes[0]
	routes, err := n.Exec(ctx, "ip", "-4", "route", "show", "root", lab.ClusterCIDR.String())
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  %s's routes to pods:\n%s\n", n.Name, indent(routes, "    "))
	cols := append(rows[:len(rows):len(rows)], endpoint{name: "outside", ip: l.OutsideIP})
	err4 := pingMatrix(ctx, d.out, rows, cols)
	return errors.Join(err4, podsAcrossNodes6(ctx, d))
}

// podsAcrossNodes6 is podsAcrossNodes' matrix over IPv6: the same pods'
// IPv6 addresses (host-gw on the IPv6 segment, VXLAN over IPv4 to node4)
// and the outside's, masqueraded by ip6tables.
func podsAcrossNodes6(ctx context.Context, d *demo) error {
	l := d.lab
	if !l.Has(ipfamily.IPv6) {
		return nil
	}
	var rows []endpoint
	for _, p := range d.pods {
		if p.Name == "a" {
			rows = append(rows, endpoint{p.Node.Name + "/" + p.Name, p.NSPath(), p.IPOf(ipfamily.IPv6)})
		}
	}
	routes, err := l.Nodes[0].Exec(ctx, "ip", "-6", "route", "show", "root", lab.ClusterCIDR6.String())
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "  IPv6: %s's routes to pods:\n%s\n", l.Nodes[0].Name, indent(routes, "    "))
	cols := append(rows[:len(rows):len(rows)], endpoint{name: "outside", ip: l.OutsideIP6})
	return pingMatrix(ctx, d.out, rows, cols)
}

func (d *demo) addPod(ctx context.Context, n *lab.Node, name string) (*lab.Pod, error) {
	p, err := n.AddPod(ctx, name)
	if err != nil {
		return nil, err
	}
	d.pods = append(d.pods, p)
	fmt.Fprintf(d.out, "  pod %s/%s: %v (netns %s)\n", n.Name, p.Name, p.IPs, p.NS)
	return p, nil
}

// pingMatrix pings every column from every row at once (bounded: one Ping
// each, at most lab.PingTimeout) and prints ✓ with the round-trip time or ✗.
func pingMatrix(ctx context.Context, out io.Writer, rows, cols []endpoint) error {
	type cell struct {
		rtt time.Duration
		err error
	}
	cells := make([][]cell, len(rows))
	var wg sync.WaitGroup
	for i, r := range rows {
		cells[i] = make([]cell, len(cols))
		for j, c := range cols {
			if r.ip == c.ip {
				continue
			}
			wg.Go(func() {
				rtt, err := lab.Ping(ctx, r.nsPath, c.ip)
				cells[i][j] = cell{rtt, err}
			})
		}
	}
	wg.Wait()

	const w = 11
	fmt.Fprintf(out, "  %-*s", w, "from \\ to")
	for _, c := range cols {
		fmt.Fprintf(out, "%-*s", w, c.name)
	}
	fmt.Fprintln(out)
	var failures []string
	for i, r := range rows {
		fmt.Fprintf(out, "  %-*s", w, r.name)
		for j, c := range cols {
			cl := cells[i][j]
			switch {
			case r.ip == c.ip:
				fmt.Fprintf(out, "%-*s", w, "·")
			case cl.err != nil:
				fmt.Fprintf(out, "%-*s", w, "✗")
				failures = append(failures, fmt.Sprintf("%s → %s: %v", r.name, c.name, cl.err))
			default:
				fmt.Fprintf(out, "%-*s", w, "✓ "+fmtRTT(cl.rtt))
			}
		}
		fmt.Fprintln(out)
	}
	if len(failures) > 0 {
		return errors.New(strings.Join(failures, "\n    "))
	}
	return nil
}

func fmtRTT(d time.Duration) string {
	return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
}

func indent(s, prefix string) string {
	var b strings.Builder
	for line := range strings.Lines(strings.TrimRight(s, "\n")) {
		b.WriteString(prefix + strings.TrimRight(line, " \n") + "\n")
	}
	return strings.TrimSuffix(b.String(), "\n")
}
