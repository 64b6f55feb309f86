package main

import (
	"fmt"
	"io"
	"slices"
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

// portRef is one Service port of the daemon's report.
type portRef struct {
	svc  proxy.ServiceStatus
	port proxy.PortStatus
}

func (r portRef) name() string {
	n := r.svc.Namespace + "/" + r.svc.Name
	if r.port.Name != "" {
		n += ":" + r.port.Name
	}
	return n
}

// compareBPFMaps joins the maps' frontends to the Service ports that claim
// them (by address and protocol) and lists where the two disagree: a
// frontend of the report missing from the maps, a port whose frontends'
// backends are not its endpoints, a frontend no Service claims.
func compareBPFMaps(p *ebpf.Programmed, services []proxy.ServiceStatus) *bpfMaps {
	m := &bpfMaps{Programmed: p, Owners: make([][]string, len(p.Frontends))}
	byFrontend := make(map[string][]int) // address/protocol → frontend indexes
	for i, f := range p.Frontends {
		k := f.Address + "/" + f.Protocol
		byFrontend[k] = append(byFrontend[k], i)
	}
	for _, svc := range services {
		for _, port := range svc.Ports {
			ref := portRef{svc, port}
			backends := map[string]bool{}
			for _, fe := range port.Frontends {
				idx := byFrontend[fe+"/"+port.Protocol]
				if len(idx) == 0 {
					m.Differences = append(m.Differences, fmt.Sprintf("%s %s: frontend %s is not in the maps", ref.name(), port.Protocol, fe))
				}
				for _, i := range idx {
					m.Owners[i] = append(m.Owners[i], ref.name())
					for _, b := range p.Frontends[i].Backends {
						backends[b] = true
					}
				}
			}
			var want, got []string
			for _, e := range port.Endpoints {
				want = append(want, e.Address)
			}
			for b := range backends {
				got = append(got, b)
			}
			slices.Sort(want)
			slices.Sort(got)
			if !slices.Equal(want, got) {
				m.Differences = append(m.Differences, fmt.Sprintf("%s %s: endpoints [%s], the maps' backends [%s]",
					ref.name(), port.Protocol, strings.Join(want, " "), strings.Join(got, " ")))
			}
		}
	}
	for i, f := range p.Frontends {
		if len(m.Owners[i]) == 0 {
			m.Differences = append(m.Differences, fmt.Sprintf("frontend %s/%s (%s) is in the maps but of no Service proxyd reports", f.Address, f.Protocol, f.Scope))
		}
	}
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
	if p.SNAT != "" {
		fmt.Fprintf(out, "; SNAT to %s", p.SNAT)
	}
	fmt.Fprintln(out)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  SERVICE\tFRONTEND\tSCOPE\tFLAGS\tBACKENDS")
	for i, f := range p.Frontends {
		owner := "-"
		if len(m.Owners[i]) > 0 {
			owner = strings.Join(m.Owners[i], ",")
		}
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
		fmt.Fprintf(w, "  %s\t%s/%s\t%s\t%s\t%s\n", owner, f.Address, f.Protocol, f.Scope, strings.TrimSpace(flags), backends)
	}
	w.Flush()
	for _, list := range []struct {
		title string
		lines []string
	}{{"Problems in the maps", p.Problems}, {"Differences from proxyd's report", m.Differences}} {
		if len(list.lines) == 0 {
			continue
		}
		fmt.Fprintf(out, "\n%s (%d):\n", list.title, len(list.lines))
		for _, l := range list.lines {
			fmt.Fprintf(out, "  %s\n", l)
		}
	}
}
