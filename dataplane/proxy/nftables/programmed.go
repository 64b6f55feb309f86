package nftables

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Programmed is what podnet's table holds, read back and resolved the way
// a packet meets it: every frontend with the endpoints its chain's maps
// name. It is what `proxyd status` shows in nftables mode, from the
// kernel, so what it shows is the kernel's state, not the daemon's intent.
type Programmed struct {
	Table     string               `json:"table"`
	Frontends []ProgrammedFrontend `json:"frontends"`
	// Chains and Elements count the table's objects of the Service proxy.
	Chains   int `json:"chains"`
	Elements int `json:"elements"`
	// Problems are elements a packet would trip over: a frontend's chain
	// missing, a chain without its endpoint map. None after a sync.
	Problems []string `json:"problems,omitempty"`
}

// ProgrammedFrontend is one element of the Service or NodePort maps, or
// of the sets of ports without endpoints.
type ProgrammedFrontend struct {
	// Address is "IP:port", or ":port" for a NodePort.
	Address  string `json:"address"`
	Protocol string `json:"protocol"`
	// Chain is where the frontend goes; "" when Reject.
	Chain  string `json:"chain,omitempty"`
	Reject bool   `json:"reject,omitempty"`
	// Endpoints are "IP:port", of the port's endpoint maps.
	Endpoints []string `json:"endpoints"`
}

func protoName(n uint32) string {
	switch n {
	case protoUDP:
		return "UDP"
	case protoSCTP:
		return "SCTP"
	}
	return "TCP"
}

// ReadProgrammed reads the table's Service objects of each family.
func ReadProgrammed(k Netlink, families []ipfamily.Family) (*Programmed, error) {
	var tables []*Table
	for _, f := range families {
		t, err := k.Read(f)
		if err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	return ProgrammedOf(tables...), nil
}

// ProgrammedOf resolves the frontends of tables (one per family).
func ProgrammedOf(tables ...*Table) *Programmed {
	p := &Programmed{Table: "inet " + TableName}
	for _, t := range tables {
		p.add(t)
	}
	slices.SortFunc(p.Frontends, func(a, b ProgrammedFrontend) int {
		return strings.Compare(a.Address+"/"+a.Protocol, b.Address+"/"+b.Protocol)
	})
	return p
}

func (p *Programmed) add(t *Table) {
	c := Config{Family: t.Family}
	n := c.names()
	p.Chains += len(t.Chains)
	for _, s := range t.Sets {
		p.Elements += len(s.Elems)
	}
	frontend := func(e Elem) (string, string) {
		if len(e.Key) == 3 {
			return netip.AddrPortFrom(e.Key[0].Addr, uint16(e.Key[2].Num)).String(), protoName(e.Key[1].Num)
		}
		return fmt.Sprintf(":%d", e.Key[1].Num), protoName(e.Key[0].Num)
	}
	eps := t.endpointIndex()
	for _, set := range []string{n.services, n.nodePorts} {
		for _, e := range t.setElems(set) {
			addr, proto := frontend(e)
			f := ProgrammedFrontend{Address: addr, Protocol: proto, Chain: e.Goto}
			if t.Chains[e.Goto] == nil {
				p.Problems = append(p.Problems, fmt.Sprintf("%s/%s goes to chain %s, which is missing", addr, proto, e.Goto))
			}
			f.Endpoints = t.endpointsOf(e.Goto, eps)
			p.Frontends = append(p.Frontends, f)
		}
	}
	for _, set := range []string{n.noEndpoints, n.noEndpointNodePorts} {
		for _, e := range t.setElems(set) {
			addr, proto := frontend(e)
			p.Frontends = append(p.Frontends, ProgrammedFrontend{Address: addr, Protocol: proto, Reject: true})
		}
	}
}

func (t *Table) setElems(name string) []Elem {
	if s := t.Sets[name]; s != nil {
		return s.Elems
	}
	return nil
}

// endpointIndex is the endpoints of the endpoint maps by target id.
func (t *Table) endpointIndex() map[uint64][]string {
	out := map[uint64][]string{}
	for name, s := range t.Sets {
		if !strings.HasPrefix(name, endpointMapPrefix) {
			continue
		}
		for _, e := range s.Elems {
			out[e.Key[0].ID] = append(out[e.Key[0].ID], e.To.String())
		}
	}
	return out
}

// endpointsOf lists the endpoints of the targets of a port's chain
// (svc-, ext- or fw-<family>-<hash>): those of either id the hash gives.
func (t *Table) endpointsOf(chain string, index map[uint64][]string) []string {
	_, id, ok := strings.Cut(chain, "-")
	if !ok {
		return nil
	}
	_, hash, _ := strings.Cut(id, "-")
	cluster, ok1 := targetID(hash, false)
	local, ok2 := targetID(hash, true)
	if !ok1 || !ok2 {
		return nil
	}
	var out []string
	for _, s := range append(slices.Clone(index[cluster]), index[local]...) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return out
}
