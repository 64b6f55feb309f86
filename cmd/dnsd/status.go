package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/dns/daemon"
	"github.com/podnet/podnet/dataplane/status"
)

// runStatus is `dnsd status`: it asks a running dnsd (its metrics port) for
// its zones, upstreams and cache, and prints them.
func runStatus(args []string, stdout, stderr io.Writer) int {
	c, code, ok := status.ParseCommand("dnsd status", "metrics-address", "127.0.0.1:9153", args, stdout, stderr)
	if !ok {
		return code
	}
	var r map[string]dns.Status
	if !c.Fetch(&r) {
		return 1
	}
	st := r[daemon.StatusSection]
	if c.JSON {
		status.PrintJSON(stdout, st)
		return 0
	}
	w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	state := "synced"
	switch {
	case !st.Synced:
		state = "loading"
	case st.Stale != "":
		state = "stale: " + st.Stale
	}
	if st.StateDir != nil {
		state = st.StateDir.ClusterState(state)
	}
	fmt.Fprintf(w, "Cluster state:\t%s\n", state)
	if st.StateDir != nil {
		fmt.Fprintf(w, "  state directory:\t%s\n", st.StateDir.Describe(time.Now()))
	}
	fmt.Fprintln(w, "Zones:\t")
	for _, z := range st.Zones {
		fmt.Fprintf(w, "  %s\t%d records\n", z.Name, z.Records)
	}
	fmt.Fprintln(w, "Upstreams:\t")
	printUpstreams(w, "  ", st.Upstreams)
	if len(st.Stubs) > 0 {
		fmt.Fprintln(w, "Stub domains:\t")
		for _, s := range st.Stubs {
			fmt.Fprintf(w, "  %s\t\n", s.Domain)
			printUpstreams(w, "    ", s.Upstreams)
		}
	}
	if c := st.Cache; c != nil {
		fmt.Fprintf(w, "Cache:\t%d entries (%d success, %d denial)\n", c.Success+c.Denial, c.Success, c.Denial)
		fmt.Fprintf(w, "  hits / misses:\t%.0f / %.0f\n", c.Hits, c.Misses)
		fmt.Fprintf(w, "  served stale:\t%.0f\n", c.ServedStale)
		fmt.Fprintf(w, "  prefetches:\t%.0f\n", c.Prefetches)
	} else {
		fmt.Fprintln(w, "Cache:\toff")
	}
	w.Flush()
	return 0
}

func printUpstreams(w io.Writer, indent string, ups []dns.UpstreamStatus) {
	for _, u := range ups {
		h := "healthy"
		switch {
		case u.Looping:
			h = "LOOPING back to dnsd, not used"
		case !u.Healthy:
			h = "DOWN"
		}
		fmt.Fprintf(w, "%s%s\t%s\n", indent, u.Address, h)
	}
}
