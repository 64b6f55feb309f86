package ebpf

import (
	"net"
	"net/netip"

	"github.com/podnet/podnet/dataplane/proxy"
)

// Config configures ebpf mode.
type Config struct {
	// PinDir holds the pinned maps and links (DefaultPinDir).
	PinDir string
	// Cgroup is the cgroup v2 directory whose processes are served: the
	// cgroup2 root for the whole node.
	Cgroup string
	// NodePortAddresses limits NodePorts to node addresses in these
	// prefixes; empty means every address but loopback.
	NodePortAddresses []netip.Prefix
}

// Proxier is the ebpf mode proxy.Backend: the attached programs and the
// syncer filling their maps.
type Proxier struct {
	*Syncer
	dp *Datapath
}

var _ proxy.Backend = (*Proxier)(nil)

// NewProxier loads and attaches the programs (see Open) and returns the
// backend; the maps keep what they held until the first Sync.
func NewProxier(cfg Config) (*Proxier, error) {
	if cfg.PinDir == "" {
		cfg.PinDir = DefaultPinDir
	}
	dp, err := Open(cfg.PinDir, cfg.Cgroup)
	if err != nil {
		return nil, err
	}
	npa := cfg.NodePortAddresses
	return &Proxier{Syncer: NewSyncer(dp.Maps, func() ([]netip.Addr, error) { return NodeAddrs(npa) }), dp: dp}, nil
}

// Close releases the process's handles; programs stay attached.
func (p *Proxier) Close() error { return p.dp.Close() }

// NodeAddrs lists this network namespace's addresses within prefixes (all
// when empty), without loopback and link-local ones: where NodePorts
// answer, as in iptables mode.
func NodeAddrs(prefixes []netip.Prefix) ([]netip.Addr, error) {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil {
			continue
		}
		ip := p.Addr().Unmap()
		if ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		if len(prefixes) > 0 && !containsAny(prefixes, ip) {
			continue
		}
		out = append(out, ip)
	}
	return sortedAddrs(out), nil
}

func containsAny(ps []netip.Prefix, a netip.Addr) bool {
	for _, p := range ps {
		if p.Contains(a) {
			return true
		}
	}
	return false
}
