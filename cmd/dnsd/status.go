package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"text/tabwriter"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/dns"
	"github.com/podnet/podnet/dataplane/dns/daemon"
	"github.com/podnet/podnet/dataplane/status"
)

// runStatus is `dnsd status`: it asks a running dnsd (its metrics port) for
// its zones, upstreams and cache, and prints them.
func runStatus(args []string, stdout io.Writer) int {
	fs := pflag.NewFlagSet("dnsd status", pflag.ContinueOnError)
	addr := fs.String("metrics-address", "127.0.0.1:9153", "the metrics address of the dnsd to ask")
	output := fs.StringP("output", "o", "text", "text or json")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(os.Stderr, "dnsd status: %v\n", err)
		return 2
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(os.Stderr, "dnsd status: -o %q: want text or json\n", *output)
		return 2
	}
	var r map[string]dns.Status
	if err := status.Fetch(*addr, &r); err != nil {
		fmt.Fprintf(os.Stderr, "dnsd status: %v\n", err)
		return 1
	}
	st := r[daemon.StatusSection]
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		enc.Encode(st)
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
	fmt.Fprintf(w, "Cluster state:\t%s\n", state)
	fmt.Fprintln(w, "Zones:\t")
	for _, z := range st.Zones {
		fmt.Fprintf(w, "  %s\t%d records\n", z.Name, z.Records)
	}
	fmt.Fprintln(w, "Upstreams:\t")
	for _, u := range st.Upstreams {
		h := "healthy"
		switch {
		case u.Looping:
			h = "LOOPING back to dnsd, not used"
		case !u.Healthy:
			h = "DOWN"
		}
		fmt.Fprintf(w, "  %s\t%s\n", u.Address, h)
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
