package main

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/ebpf"
)

// bpfMaps is the ebpf mode's part of proxyd status: the pinned maps as the
// programs resolve them, set against what the daemon says it programmed.
type bpfMaps struct {
	*ebpf.Programmed
	// Error says why the maps could not be read.
	Error string `json:"error,omitempty"`
	// Owners names, per frontend (by index), the Service ports that
	// claim it: "namespace/name" and the port's name, if any.
	Owners [][]string `json:"owners,omitempty"`
	// Differences are what the daemon's report and the maps disagree on.
	Differences []string `json:"differences,omitempty"`
}

// readBPFMaps reads the maps pinned in pinDir and compares them with the
// Services the daemon reports.
func readBPFMaps(pinDir string, services []proxy.ServiceStatus) *bpfMaps {
	p, err := ebpf.ReadPinned(pinDir)
	if err != nil {
		return &bpfMaps{Error: err.Error()}
	}
	return compareBPFMaps(p, services)
}

// compareBPFMaps sets the maps' frontends against the daemon's report.
func compareBPFMaps(p *ebpf.Programmed, services []proxy.ServiceStatus) *bpfMaps {
	fes := make([]kernelFrontend, len(p.Frontends))
	for i, f := range p.Frontends {
		fes[i] = kernelFrontend{Address: f.Address, Family: f.Family, Protocol: f.Protocol, Label: "(" + f.Scope + ")", Endpoints: f.Backends}
	}
	m := &bpfMaps{Programmed: p}
	m.Owners, m.Differences = compareWithReport(fes, services, "the maps")
	return m
}

// printBPFMaps writes the maps' section of proxyd status: one line per
// frontend with the Service ports claiming it, then what is wrong.
func printBPFMaps(out io.Writer, m *bpfMaps) {
	if m.Programmed == nil {
		fmt.Fprintf(out, "\nBPF maps: %s\n", m.Error)
		return
	}
	p := m.Programmed
	fmt.Fprintf(out, "\nBPF maps (%s): %d frontends, %d backends; NodePorts on %s", p.PinDir, len(p.Frontends), p.Backends, orNone(strings.Join(p.NodeAddrs, " ")))
	if len(p.SNAT) > 0 {
		fmt.Fprintf(out, "; SNAT to %s", strings.Join(p.SNAT, " "))
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  SERVICE\tFRONTEND\tSCOPE\tFLAGS\tBACKENDS")
	for i, f := range p.Frontends {
		flags := strings.Join(f.Flags, ",")
		if f.AffinitySeconds > 0 {
			flags += fmt.Sprintf(" %ds", f.AffinitySeconds)
		}
		if len(f.SourceRanges) > 0 {
			flags += " from " + strings.Join(f.SourceRanges, ",")
		}
		if f.Maglev > 0 {
			flags += fmt.Sprintf(" maglev/%d", f.Maglev)
		}
		backends := strings.Join(f.Backends, " ")
		if len(f.Backends) == 0 {
			backends = "none"
		}
		fmt.Fprintf(w, "  %s\t%s/%s\t%s\t%s\t%s\n", ownerOf(m.Owners[i]), f.Address, f.Protocol, f.Scope, strings.TrimSpace(flags), backends)
	}
	w.Flush()
	printProblems(out, "the maps", p.Problems, m.Differences)
}
