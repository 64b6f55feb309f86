package main

import (
	"fmt"
	"io"
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

// compareNFTTable sets the table's frontends against the daemon's report.
func compareNFTTable(p *nftables.Programmed, services []proxy.ServiceStatus) *nftTable {
	fes := make([]kernelFrontend, len(p.Frontends))
	for i, f := range p.Frontends {
		fes[i] = kernelFrontend{Address: f.Address, Protocol: f.Protocol, Endpoints: f.Endpoints, Rejects: f.Reject, CheckReject: true}
	}
	m := &nftTable{Programmed: p}
	m.Owners, m.Differences = compareWithReport(fes, services, "the table")
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
		chain, eps := f.Chain, strings.Join(f.Endpoints, " ")
		if f.Reject {
			chain, eps = "reject", "none"
		}
		fmt.Fprintf(w, "  %s\t%s/%s\t%s\t%s\n", ownerOf(m.Owners[i]), f.Address, f.Protocol, chain, eps)
	}
	w.Flush()
	printProblems(out, "the table", p.Problems, m.Differences)
}
