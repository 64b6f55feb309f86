package lab

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"

	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// ControlPlane is a namespace for processes that outlive labs — an API
// server and its etcd, started once per test binary — and that labs plug
// into their underlay (Attach). It is a run of the lab family of its own:
// <prefix>-cp with cgroup podnet-<prefix>-cp, recorded in RunDir, so what a
// crashed run left is swept like a crashed lab.
type ControlPlane struct {
	// Host runs processes in the control-plane namespace (Exec, Start).
	Host *Node
	// Dir holds the control plane's files.
	Dir string

	lab *Lab
}

// NewControlPlane creates the control-plane namespace, with only loopback up.
func NewControlPlane(ctx context.Context, logf func(format string, args ...any)) (*ControlPlane, error) {
	cgroupRoot, err := cgroup2Root()
	if err != nil {
		return nil, err
	}
	l, err := newLab(Options{Nodes: []NodeSpec{}, Logf: logf}, cgroupRoot)
	if err != nil {
		return nil, err
	}
	// newLab planned the default nodes and the outside host; a control
	// plane has one host only.
	l.Nodes = nil
	l.Segments = nil
	if err := sweepStale(l.logf); err != nil {
		l.logf("lab: removing stale labs: %v", err)
	}
	host := &Node{
		Name: "cp", NS: l.Prefix + "-cp", Iface: "eth0",
		Dir:    filepath.Join(l.WorkDir, "cp"),
		Cgroup: filepath.Join(cgroupRoot, "podnet-"+l.Prefix+"-cp"),
		lab:    l,
	}
	l.OutsideHost = host
	// Close removes the namespace called Outside.
	l.Outside = host.NS
	cp := &ControlPlane{Host: host, Dir: host.Dir, lab: l}
	if err := writeRecord(runRecord{Prefix: l.Prefix, WorkDir: l.WorkDir, OwnsWorkDir: true}); err != nil {
		os.RemoveAll(l.WorkDir)
		return nil, err
	}
	if err := cp.build(ctx); err != nil {
		return nil, errors.Join(err, cp.Close())
	}
	return cp, nil
}

func (cp *ControlPlane) build(ctx context.Context) error {
	h := cp.Host
	if err := os.MkdirAll(h.Dir, 0o755); err != nil {
		return fmt.Errorf("create control plane dir: %w", err)
	}
	if err := os.Mkdir(h.Cgroup, 0o755); err != nil {
		return fmt.Errorf("create cgroup of the control plane: %w", err)
	}
	if err := createNetns(ctx, h.NS); err != nil {
		return err
	}
	nh, err := openNS(h.NS)
	if err != nil {
		return err
	}
	defer nh.close()
	return nh.up("lo")
}

// NSPath is the path of the control-plane namespace.
func (cp *ControlPlane) NSPath() string { return cp.Host.NSPath() }

// Close ends the control plane's processes and removes its namespace,
// cgroup and files.
func (cp *ControlPlane) Close() error { return cp.lab.Close() }

// Attach plugs the control plane into the lab's underlay segment of addr
// (e.g. 192.168.10.2/24) with a veth, and routes the lab's other segments
// through that segment's router, so every node reaches the control plane
// at addr.Addr(). The returned detach removes the veth again; a lab that is
// closed first takes it away with its underlay.
func (l *Lab) Attach(cp *ControlPlane, addr netip.Prefix) (detach func() error, err error) {
	i := slices.IndexFunc(l.Segments, func(s Segment) bool { return s.Subnet == addr.Masked() })
	if i < 0 {
		return nil, fmt.Errorf("attach control plane: %v is on none of the lab's segments", addr)
	}
	seg := l.Segments[i]
	under, err := openNS(l.Underlay)
	if err != nil {
		return nil, err
	}
	defer under.close()
	h, err := openNS(cp.Host.NS)
	if err != nil {
		return nil, err
	}
	defer h.close()
	// Named after the lab: a veth of a lab closed a moment ago may still be
	// on its way out of the kernel.
	ifname := l.Prefix
	if err := l.plug(under, "cp", seg.Bridge, h, ifname); err != nil {
		return nil, fmt.Errorf("attach control plane: %w", err)
	}
	detach = func() error {
		link, err := h.nl.LinkByName(ifname)
		if err != nil {
			return nil
		}
		return h.nl.LinkDel(link)
	}
	if err := h.addrUp(ifname, addr); err != nil {
		return nil, errors.Join(err, detach())
	}
	for _, s := range l.Segments {
		if s.Subnet == seg.Subnet {
			continue
		}
		dst := &net.IPNet{IP: s.Subnet.Addr().AsSlice(), Mask: net.CIDRMask(s.Subnet.Bits(), 32)}
		r := &netlink.Route{Dst: dst, Gw: seg.Gateway.AsSlice()}
		if err := h.nl.RouteAdd(r); err != nil {
			return nil, errors.Join(fmt.Errorf("attach control plane: route to %v: %w", s.Subnet, err), detach())
		}
	}
	if l.Has(ipfamily.IPv6) {
		if err := l.attach6(h, ifname, seg, addr.Addr()); err != nil {
			return nil, errors.Join(err, detach())
		}
	}
	// The handle is closed on return; detach opens its own.
	nsName := cp.Host.NS
	return func() error {
		h, err := openNS(nsName)
		if err != nil {
			return err
		}
		defer h.close()
		link, err := h.nl.LinkByName(ifname)
		if err != nil {
			return nil // gone with the lab's underlay
		}
		if err := h.nl.LinkDel(link); err != nil {
			return fmt.Errorf("detach control plane: %w", err)
		}
		return nil
	}, nil
}

// Kill ends the process at once with SIGKILL and waits (up to 5 s) until it
// is gone: a crash, for outage tests and for servers whose graceful
// shutdown waits for long-lived clients.
func (p *Proc) Kill() { p.kill() }

// attach6 gives the attached control plane its IPv6 address in a lab with
// IPv6: the segment's ULA subnet beside its IPv4 one, ending in the same
// byte as addr (192.168.10.2 → fd00:10:10::2), and routes to the other
// segments' IPv6 subnets through the segment's router.
func (l *Lab) attach6(h *nsHandle, ifname string, seg Segment, addr netip.Addr) error {
	sub6 := ula6(seg.Subnet)
	if err := h.addrUp(ifname, netip.PrefixFrom(hostIn(sub6, addr.As4()[3]), sub6.Bits())); err != nil {
		return fmt.Errorf("attach control plane: %w", err)
	}
	for _, s := range l.Segments {
		if s.Subnet == seg.Subnet {
			continue
		}
		other := ula6(s.Subnet)
		dst := &net.IPNet{IP: other.Addr().AsSlice(), Mask: net.CIDRMask(other.Bits(), 128)}
		if err := h.nl.RouteAdd(&netlink.Route{Dst: dst, Gw: hostIn(sub6, 1).AsSlice()}); err != nil {
			return fmt.Errorf("attach control plane: route to %v: %w", other, err)
		}
	}
	return nil
}
