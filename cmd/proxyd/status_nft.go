package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
)

// nftTable is the nftables mode's part of proxyd status: podnet's table
// as a packet meets it, set against what the daemon says it programmed.
type nftTable struct {
	*nftables.Programmed
	// Error says why the table could not be read.
	Error string `json:"error,omitempty"`
	// Owners names, per frontend (by index), the Service ports that
	// claim it.
	Owners [][]string `json:"owners,omitempty"`
	// Differences are what the daemon's report and the table disagree on.
	Differences []string `json:"differences,omitempty"`
}

// readNFTTable reads podnet's table in this network namespace and
// compares it with the Services the daemon reports.
func readNFTTable(services []proxy.ServiceStatus) *nftTable {
	p, err := nftables.ReadProgrammed(nftables.Netlink{}, ipfamily.All)
	if err != nil {
		return &nftTable{Error: err.Error()}
	}
	return compareNFTTable(p, services)
}

// compareNFTTable joins the table's frontends to the Service ports that
// claim them (by address and protocol) and lists where the two disagree:
// a frontend of the report missing from the table, a port whose
// frontends' endpoints are not its endpoints (or that rejects while it
// has some), a frontend no Service claims.
func compareNFTTable(p *nftables.Programmed, services []proxy.ServiceStatus) *nftTable {
	m := &nftTable{Programmed: p, Owners: make([][]string, len(p.Frontends))}
	byFrontend := make(map[string][]int)
	for i, f := range p.Frontends {
		k := f.Address + "/" + f.Protocol
		byFrontend[k] = append(byFrontend[k], i)
	}
	for _, svc := range services {
		for _, port := range svc.Ports {
			ref := portRef{svc, port}
			got := map[string]bool{}
			for _, fe := range port.Frontends {
				idx := byFrontend[fe+"/"+port.Protocol]
				if len(idx) == 0 {
					m.Differences = append(m.Differences, fmt.Sprintf("%s %s: frontend %s is not in the table", ref.name(), port.Protocol, fe))
				}
				for _, i := range idx {
					m.Owners[i] = append(m.Owners[i], ref.name())
					if p.Frontends[i].Reject != port.NoEndpoints {
						m.Differences = append(m.Differences, fmt.Sprintf("%s %s: frontend %s rejects: %v, the report says no endpoints: %v",
							ref.name(), port.Protocol, fe, p.Frontends[i].Reject, port.NoEndpoints))
					}
					for _, e := range p.Frontends[i].Endpoints {
						got[e] = true
					}
				}
			}
			var want []string
			for _, e := range port.Endpoints {
				want = append(want, e.Address)
			}
			have := slices.Sorted(func(yield func(string) bool) {
				for e := range got {
					if !yield(e) {
						return
					}
				}
			})
			slices.Sort(want)
			if !slices.Equal(want, have) {
				m.Differences = append(m.Differences, fmt.Sprintf("%s %s: endpoints [%s], the table's [%s]",
					ref.name(), port.Protocol, strings.Join(want, " "), strings.Join(have, " ")))
			}
		}
	}
	for i, f := range p.Frontends {
		if len(m.Owners[i]) == 0 {
			m.Differences = append(m.Differences, fmt.Sprintf("frontend %s/%s is in the table but of no Service proxyd reports", f.Address, f.Protocol))
		}
	}
	return m
}

// printNFTTable writes the table's section of proxyd status.
func printNFTTable(out io.Writer, m *nftTable) {
	if m.Programmed == nil {
		fmt.Fprintf(out, "\nnftables table: %s\n", m.Error)
		return
	}
	p := m.Programmed
	fmt.Fprintf(out, "\nnftables table %s: %d frontends, %d chains, %d elements\n", p.Table, len(p.Frontends), p.Chains, p.Elements)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  SERVICE\tFRONTEND\tCHAIN\tENDPOINTS")
	for i, f := range p.Frontends {
		owner := "-"
		if len(m.Owners[i]) > 0 {
			owner = strings.Join(m.Owners[i], ",")
		}
		chain, eps := f.Chain, strings.Join(f.Endpoints, " ")
		if f.Reject {
			chain, eps = "reject", "none"
		}
		fmt.Fprintf(w, "  %s\t%s/%s\t%s\t%s\n", owner, f.Address, f.Protocol, chain, eps)
	}
	w.Flush()
	for _, list := range []struct {
		title string
		lines []string
	}{{"Problems in the table", p.Problems}, {"Differences from proxyd's report", m.Differences}} {
		if len(list.lines) == 0 {
			continue
		}
		fmt.Fprintf(out, "\n%s (%d):\n", list.title, len(list.lines))
		for _, l := range list.lines {
			fmt.Fprintf(out, "  %s\n", l)
		}
	}
}
