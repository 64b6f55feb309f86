package main

import (
	"fmt"
	"io"
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// kernelFrontend is one frontend as a mode's kernel state holds it (the
// ebpf maps, the nftables table), in the terms the daemon's report uses.
type kernelFrontend struct {
	Address, Protocol string
	// Family is the address's family ("IPv4", "IPv6"), when the mode
	// tells: a NodePort (":port") then belongs only to the ports of that
	// family. Empty: any.
	Family string
	// Label follows the frontend in messages, e.g. "(socket)"; may be empty.
	Label string
	// Endpoints are the addresses the frontend sends to.
	Endpoints []string
	// Rejects is whether the frontend answers with reject; checked only
	// when the mode can tell (CheckReject).
	Rejects, CheckReject bool
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

// compareWithReport joins the kernel's frontends to the Service ports that
// claim them (by address and protocol) and lists where the two disagree,
// naming the kernel's side as where ("the maps", "the table"): a frontend
// of the report missing there, a port whose frontends' endpoints are not
// its endpoints (or that rejects while it has some), a frontend no Service
// claims. owners names, per frontend, the Service ports claiming it.
func compareWithReport(fes []kernelFrontend, services []proxy.ServiceStatus, where string) (owners [][]string, diffs []string) {
	owners = make([][]string, len(fes))
	byFrontend := make(map[string][]int) // address/protocol → frontend indexes
	for i, f := range fes {
		k := f.Address + "/" + f.Protocol
		byFrontend[k] = append(byFrontend[k], i)
	}
	for _, svc := range services {
		for _, port := range svc.Ports {
			ref := portRef{svc, port}
			family := portFamily(port)
			got := map[string]bool{}
			for _, fe := range port.Frontends {
				idx := slices.DeleteFunc(slices.Clone(byFrontend[fe+"/"+port.Protocol]), func(i int) bool {
					return fes[i].Family != "" && family != "" && fes[i].Family != family
				})
				if len(idx) == 0 {
					diffs = append(diffs, fmt.Sprintf("%s %s: frontend %s is not in %s", ref.name(), port.Protocol, fe, where))
				}
				for _, i := range idx {
					owners[i] = append(owners[i], ref.name())
					if fes[i].CheckReject && fes[i].Rejects != port.NoEndpoints {
						diffs = append(diffs, fmt.Sprintf("%s %s: frontend %s rejects: %v, the report says no endpoints: %v",
							ref.name(), port.Protocol, fe, fes[i].Rejects, port.NoEndpoints))
					}
					for _, e := range fes[i].Endpoints {
						got[e] = true
					}
				}
			}
			var want []string
			for _, e := range port.Endpoints {
				want = append(want, e.Address)
			}
			slices.Sort(want)
			have := slices.Sorted(func(yield func(string) bool) {
				for e := range got {
					if !yield(e) {
						return
					}
				}
			})
			if !slices.Equal(want, have) {
				diffs = append(diffs, fmt.Sprintf("%s %s: endpoints [%s], in %s [%s]",
					ref.name(), port.Protocol, strings.Join(want, " "), where, strings.Join(have, " ")))
			}
		}
	}
	for i, f := range fes {
		if len(owners[i]) == 0 {
			label := ""
			if f.Label != "" {
				label = " " + f.Label
			}
			diffs = append(diffs, fmt.Sprintf("frontend %s/%s%s is in %s but of no Service proxyd reports", f.Address, f.Protocol, label, where))
		}
	}
	return owners, diffs
}

// ownerOf is the Service ports claiming a frontend, or "-".
func ownerOf(owners []string) string {
	if len(owners) == 0 {
		return "-"
	}
	return strings.Join(owners, ",")
}

// printProblems writes the kernel's own problems and its differences from
// the report, each list under a title, where there are any.
func printProblems(out io.Writer, where string, problems, diffs []string) {
	for _, list := range []struct {
		title string
		lines []string
	}{{"Problems in " + where, problems}, {"Differences from proxyd's report", diffs}} {
		if len(list.lines) == 0 {
			continue
		}
		fmt.Fprintf(out, "\n%s (%d):\n", list.title, len(list.lines))
		for _, l := range list.lines {
			fmt.Fprintf(out, "  %s\n", l)
		}
	}
}

// portFamily is the family of a report port's first frontend with an
// address (its cluster IP), as kernelFrontend.Family writes it; "" if none.
func portFamily(port proxy.PortStatus) string {
	for _, fe := range port.Frontends {
		if ap, err := netip.ParseAddrPort(fe); err == nil {
			return ipfamily.Of(ap.Addr()).String()
		}
	}
	return ""
}
