package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/podnet/podnet/e2e/lab"
)

type demoOptions struct {
	keep   bool
	binDir string
}

// step is one thing the demo shows. run prints what it saw to d.out and
// returns an error when something that should work did not, or a skipError
// when a prerequisite (a binary that cannot do it yet) is missing.
type step struct {
	title string
	run   func(ctx context.Context, d *demo) error
}

// steps is the demo, in order. To show more (pod ↔ pod across nodes once
// proxyd routes, Service VIPs, NodePort, `dig @10.96.0.10 kubernetes.default`
// from a pod), append a step; pods made by earlier steps are in d.pods.
var steps = []step{
	{"nodes reach each other and the outside over the underlay", nodeMatrix},
	{"pods on node1 reach each other and their node over cbr0", podsOnOneNode},
}

type demo struct {
	lab  *lab.Lab
	out  io.Writer
	pods []*lab.Pod
}

// skipError marks a step that could not run yet; it does not fail the demo.
type skipError struct{ reason string }

func (e skipError) Error() string { return "skipped: " + e.reason }

func runDemo(ctx context.Context, out io.Writer, o demoOptions) error {
	start := time.Now()
	l, err := lab.New(ctx, lab.Options{BinDir: o.binDir, Detached: o.keep})
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

	d := &demo{lab: l, out: out}
	failed, skipped := 0, 0
	for i, s := range steps {
		if ctx.Err() != nil {
			fmt.Fprintln(out, "\ninterrupted")
			return ctx.Err()
		}
		fmt.Fprintf(out, "\n[%d/%d] %s\n", i+1, len(steps), s.title)
		err := s.run(ctx, d)
		var skip skipError
		switch {
		case errors.As(err, &skip):
			skipped++
			fmt.Fprintf(out, "  - %v\n", err)
		case err != nil:
			failed++
			fmt.Fprintf(out, "  ✗ %v\n", err)
			if logs := l.Logs(); logs != "" {
				fmt.Fprintf(out, "%s\n", indent(logs, "    "))
			}
		default:
			fmt.Fprintln(out, "  ✓ ok")
		}
	}
	fmt.Fprintf(out, "\n%d steps: %d ok, %d failed, %d skipped\n", len(steps), len(steps)-failed-skipped, failed, skipped)

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

// podsOnOneNode adds two pods to node1 through the CNI plugin and lets them
// ping each other and their node.
func podsOnOneNode(ctx context.Context, d *demo) error {
	l := d.lab
	if err := lab.PluginSupportsADD(ctx, l.BinDir); err != nil {
		return skipError{fmt.Sprintf("the CNI plugin cannot add pods yet (%v)", err)}
	}
	n := l.Nodes[0]
	if _, err := os.Stat(n.NodeConfigPath()); errors.Is(err, os.ErrNotExist) {
		// No proxyd has written the node config: write it as proxyd would.
		if err := n.WriteNodeConfig(); err != nil {
			return err
		}
	}
	var rows []endpoint
	for _, name := range []string{"a", "b"} {
		p, err := n.AddPod(ctx, name)
		if err != nil {
			return err
		}
		d.pods = append(d.pods, p)
		fmt.Fprintf(d.out, "  pod %s on %s: %s (netns %s)\n", p.Name, n.Name, p.IP, p.NS)
		rows = append(rows, endpoint{"pod " + p.Name, p.NSPath(), p.IP})
	}
	cols := append(rows[:len(rows):len(rows)], endpoint{name: n.Name, ip: n.IP})
	return pingMatrix(ctx, d.out, rows, cols)
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
	return prefix + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n"+prefix)
}
