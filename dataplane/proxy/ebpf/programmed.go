package ebpf

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"slices"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/bpf"
	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Programmed is what the maps hold, read back and resolved the way the
// programs resolve them: every frontend with the backends its slots name.
// It is what `proxyd status` shows in ebpf mode, from the pinned maps, so
// what it shows is the kernel's state, not the daemon's intent.
type Programmed struct {
	PinDir    string               `json:"pinDir"`
	Frontends []ProgrammedFrontend `json:"frontends"`
	// Backends counts the backends map's entries.
	Backends int `json:"backends"`
	// NodeAddrs are the addresses NodePorts answer on.
	NodeAddrs []string `json:"nodeAddresses"`
	// SNAT are the addresses traffic from outside to external IPs and
	// load-balancer IPs is SNATed to, IPv4's then IPv6's (none while
	// unset).
	SNAT []string `json:"snatAddresses,omitempty"`
	// Problems are entries a program would trip over or never reach: a
	// counted slot missing, a slot naming a missing backend or another
	// service's, a slot or backend nothing reaches. None after a sync.
	Problems []string `json:"problems,omitempty"`
}

// ProgrammedFrontend is one frontend (slot 0) and its slots.
type ProgrammedFrontend struct {
	// Address is "IP:port", or ":port" for a NodePort on every node
	// address.
	Address string `json:"address"`
	// Family is the frontend's address family, "IPv4" or "IPv6" (a
	// NodePort's wildcard has one too: a dual-stack Service holds one per
	// family).
	Family   string `json:"family"`
	Protocol string `json:"protocol"`
	// Scope is "socket" (pods and the node, socket LB) or "external"
	// (traffic from outside, the tc programs).
	Scope     string `json:"scope"`
	ServiceID uint32 `json:"serviceID"`
	// Flags: "reject" (no endpoint: refused), "affinity" (ClientIP, for
	// AffinitySeconds), "source-ranges", "local" (client address kept).
	Flags           []string `json:"flags,omitempty"`
	AffinitySeconds uint32   `json:"affinitySeconds,omitempty"`
	// Backends are "IP:port" in slot order.
	Backends []string `json:"backends"`
	// Maglev is how many backends the service's Maglev table spreads the
	// external scope's flows over (0: no table).
	Maglev int `json:"maglev,omitempty"`
	// SourceRanges are the loadBalancerSourceRanges let in.
	SourceRanges []string `json:"sourceRanges,omitempty"`
}

// ReadPinned reads the maps pinned in pinDir, read-only.
func ReadPinned(pinDir string) (*Programmed, error) {
	open := func(name string) (*ebpf.Map, error) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(pinDir, name), &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil {
			return nil, fmt.Errorf("open pinned map %s: %w", filepath.Join(pinDir, name), err)
		}
		return m, nil
	}
	names := []string{bpf.SockMapServicesV2, bpf.SockMapBackendsV2, bpf.SockMapNodeaddrsV1,
		bpf.NodeportMapSrcrangeV2, bpf.NodeportMapMaglevV2, bpf.NodeportMapSnatV2}
	ms := make([]*ebpf.Map, 0, len(names))
	defer func() {
		for _, m := range ms {
			m.Close()
		}
	}()
	for _, n := range names {
		m, err := open(n)
		if err != nil {
			return nil, err
		}
		ms = append(ms, m)
	}
	p, err := Describe(&Maps{
		Services:  kernelTable[svcKey, svcVal]{ms[0]},
		Backends:  kernelTable[uint32, backend]{ms[1]},
		NodeAddrs: kernelTable[nodeKey, uint8]{ms[2]},
		Ranges:    kernelTable[rangeKey, uint8]{ms[3]},
		Maglev:    kernelTable[uint32, maglevTable]{ms[4]},
		SNAT:      kernelTable[uint32, bpf.NodeportSnatAddr]{ms[5]},
	})
	if err != nil {
		return nil, err
	}
	p.PinDir = pinDir
	return p, nil
}

// mapContents is every entry of the maps Describe reads.
type mapContents struct {
	services map[svcKey]svcVal
	backends map[uint32]backend
	nodes    map[nodeKey]uint8
	ranges   map[rangeKey]uint8
	maglev   map[uint32]maglevTable
	snat     map[uint32]bpf.NodeportSnatAddr
}

func dumpAll(m *Maps) (*mapContents, error) {
	var c mapContents
	var errs [6]error
	c.services, errs[0] = m.Services.Dump()
	c.backends, errs[1] = m.Backends.Dump()
	c.nodes, errs[2] = m.NodeAddrs.Dump()
	c.ranges, errs[3] = m.Ranges.Dump()
	c.maglev, errs[4] = m.Maglev.Dump()
	c.snat, errs[5] = m.SNAT.Dump()
	return &c, errors.Join(errs[:]...)
}

// Describe reads m and resolves it as the programs do.
func Describe(m *Maps) (*Programmed, error) {
	c, err := dumpAll(m)
	if err != nil {
		return nil, err
	}
	p := &Programmed{Backends: len(c.backends), Frontends: []ProgrammedFrontend{}}
	used := make(map[uint32]bool) // backends some slot reaches
	for k, v := range c.services {
		if k.Slot == 0 {
			p.Frontends = append(p.Frontends, c.frontend(k, v, used, &p.Problems))
			continue
		}
		fk := k
		fk.Slot = 0
		if fe, ok := c.services[fk]; !ok || k.Slot > fe.Count {
			p.Problems = append(p.Problems, fmt.Sprintf("%s: slot %d is past the frontend's count or has no frontend", feName(k), k.Slot))
		}
	}
	for id := range c.backends {
		if !used[id] {
			p.Problems = append(p.Problems, fmt.Sprintf("backend %d: no slot names it", id))
		}
	}
	for k := range c.nodes {
		p.NodeAddrs = append(p.NodeAddrs, addrFrom16(k.Addr).String())
	}
	for _, i := range []uint32{snatIPv4, snatIPv6} {
		if a, ok := c.snat[i]; ok && a.Addr != [16]byte{} {
			p.SNAT = append(p.SNAT, addrFrom16(a.Addr).String())
		}
	}
	slices.Sort(p.NodeAddrs)
	slices.Sort(p.Problems)
	slices.SortFunc(p.Frontends, func(a, b ProgrammedFrontend) int {
		return cmp.Or(cmp.Compare(a.Address, b.Address), cmp.Compare(a.Protocol, b.Protocol), cmp.Compare(a.Scope, b.Scope))
	})
	return p, nil
}

// frontend resolves the frontend at slot 0 key k, marking the backends it
// reaches in used and recording what a program would trip over.
func (c *mapContents) frontend(k svcKey, v svcVal, used map[uint32]bool, problems *[]string) ProgrammedFrontend {
	f := ProgrammedFrontend{
		Address: feAddress(k), Family: keyFamily(k).String(), Protocol: protoName(k.Proto), Scope: "socket",
		ServiceID: v.Id, AffinitySeconds: v.Affinity, Backends: []string{},
	}
	if k.Scope == scopeExt {
		f.Scope = "external"
	}
	for _, fl := range []struct {
		bit  uint8
		name string
	}{{feReject, "reject"}, {feAffinity, "affinity"}, {feSrcRange, "source-ranges"}, {feLocal, "local"}} {
		if v.Flags&fl.bit != 0 {
			f.Flags = append(f.Flags, fl.name)
		}
	}
	for i := uint16(1); i <= v.Count; i++ {
		sk := k
		sk.Slot = i
		slot, ok := c.services[sk]
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s: slot %d of %d missing", feName(k), i, v.Count))
			continue
		}
		used[slot.Id] = true
		b, ok := c.backends[slot.Id]
		if !ok {
			*problems = append(*problems, fmt.Sprintf("%s: slot %d names backend %d, which is missing", feName(k), i, slot.Id))
			continue
		}
		if b.Svc != v.Id {
			*problems = append(*problems, fmt.Sprintf("%s: slot %d names backend %d of service %d, not %d", feName(k), i, slot.Id, b.Svc, v.Id))
		}
		f.Backends = append(f.Backends, netip.AddrPortFrom(addrFrom16(b.Addr), be16(b.Port)).String())
	}
	if t, ok := c.maglev[v.Id]; ok && k.Scope == scopeExt {
		distinct := make(map[uint32]bool)
		for _, id := range t.Ids {
			distinct[id] = true
		}
		f.Maglev = len(distinct)
	}
	if v.Flags&feSrcRange != 0 {
		for r := range c.ranges {
			if r.Svc == v.Id {
				bits := int(r.Prefixlen) - 32
				a := addrFrom16(r.Addr)
				if a.Is4() {
					bits -= 96
				}
				f.SourceRanges = append(f.SourceRanges, netip.PrefixFrom(a, bits).String())
			}
		}
		slices.Sort(f.SourceRanges)
	}
	return f
}

// feAddress is a frontend key's address as proxy.PortStatus writes
// frontends: "IP:port", ":port" for the NodePort wildcard.
func feAddress(k svcKey) string {
	a := addrFrom16(k.Addr)
	if !a.IsValid() {
		return fmt.Sprintf(":%d", be16(k.Port))
	}
	return netip.AddrPortFrom(a, be16(k.Port)).String()
}

// keyFamily is the family of a frontend key's address, the NodePort
// wildcards included (::ffff:0.0.0.0 is IPv4's).
func keyFamily(k svcKey) ipfamily.Family {
	if netip.AddrFrom16(k.Addr).Is4In6() {
		return ipfamily.IPv4
	}
	return ipfamily.IPv6
}

func feName(k svcKey) string {
	scope := "socket"
	if k.Scope == scopeExt {
		scope = "external"
	}
	return fmt.Sprintf("frontend %s/%s (%s)", feAddress(k), protoName(k.Proto), scope)
}

func protoName(p uint8) string {
	switch p {
	case 6:
		return "TCP"
	case 17:
		return "UDP"
	case 132:
		return "SCTP"
	}
	return fmt.Sprint(p)
}
