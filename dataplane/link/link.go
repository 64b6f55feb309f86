// Package link creates and inspects the pod-facing devices on a node: the
// bridge the pods hang off and the veth pair of each pod, over netlink.
//
// Every function works in the network namespace of the calling thread,
// except where it takes a pod namespace explicitly; callers that work in
// another namespace enter it with ns.Do first.
package link

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// hostVethPrefix starts the name of every host-side veth podnet creates, so
// GC can tell them apart from devices it does not own.
const hostVethPrefix = "pn"

// hostVethHashLen keeps names within the kernel's 15-byte limit.
const hostVethHashLen = 13

// HostVethName is the name of the host side of the veth for one pod
// interface. It depends only on (containerID, ifName), so DEL and GC find the
// device without any state of their own.
func HostVethName(containerID, ifName string) string {
	sum := sha256.Sum256([]byte(containerID + "\x00" + ifName))
	return hostVethPrefix + hex.EncodeToString(sum[:])[:hostVethHashLen]
}

// IsHostVethName reports whether name has the shape HostVethName produces.
func IsHostVethName(name string) bool {
	if len(name) != len(hostVethPrefix)+hostVethHashLen || name[:len(hostVethPrefix)] != hostVethPrefix {
		return false
	}
	_, err := hex.DecodeString(name[len(hostVethPrefix):] + "0")
	return err == nil
}

// MACFromIP derives a stable locally administered MAC from an IPv4 address
// (0a:58 followed by the address), so a reused pod IP keeps its MAC and peers'
// ARP caches never go stale. Other addresses get a random MAC.
func MACFromIP(a netip.Addr) net.HardwareAddr {
	if a.Is4() {
		b := a.As4()
		return net.HardwareAddr{0x0a, 0x58, b[0], b[1], b[2], b[3]}
	}
	return RandomMAC()
}

// RandomMAC returns a random unicast, locally administered MAC.
func RandomMAC() net.HardwareAddr {
	m := make(net.HardwareAddr, 6)
	rand.Read(m)
	m[0] = m[0]&^0x01 | 0x02
	return m
}

// NotFound reports whether err says a link does not exist.
func NotFound(err error) bool {
	var nf netlink.LinkNotFoundError
	return errors.As(err, &nf) || errors.Is(err, unix.ENODEV)
}

// Bridge returns the bridge called name, creating it up with the given MTU
// and MAC if it does not exist. An existing device of another kind is an error.
func Bridge(name string, mtu int, mac net.HardwareAddr) (*netlink.Bridge, error) {
	l, err := netlink.LinkByName(name)
	if err == nil {
		br, ok := l.(*netlink.Bridge)
		if !ok {
			return nil, fmt.Errorf("%s exists and is a %s device, not a bridge", name, l.Type())
		}
		if br.Flags&net.FlagUp == 0 {
			if err := noDAD(name); err != nil {
				return nil, err
			}
			if err := netlink.LinkSetUp(br); err != nil {
				return nil, fmt.Errorf("set %s up: %w", name, err)
			}
		}
		return br, nil
	}
	if !NotFound(err) {
		return nil, fmt.Errorf("look up bridge %s: %w", name, err)
	}
	br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{
		Name:         name,
		MTU:          mtu,
		HardwareAddr: mac,
		TxQLen:       -1,
	}}
	if err := netlink.LinkAdd(br); err != nil {
		if errors.Is(err, unix.EEXIST) {
			// Another ADD created it between our lookup and our add.
			return Bridge(name, mtu, mac)
		}
		return nil, fmt.Errorf("create bridge %s: %w", name, err)
	}
	if err := noDAD(name); err != nil {
		return nil, err
	}
	if err := netlink.LinkSetUp(br); err != nil {
		return nil, fmt.Errorf("set %s up: %w", name, err)
	}
	return br, nil
}

// noDAD turns off IPv6 duplicate address detection on a device podnet
// owns, before it comes up. The device's link-local address is otherwise
// tentative for a second or two, and while it is, the kernel sends no
// neighbour solicitation from the device (one needs a usable link-local
// source): the first packet forwarded to a pod on a new bridge waits a
// whole retransmit interval (1 s) for its neighbour. Without IPv6 on the
// node there is nothing to turn off.
func noDAD(name string) error {
	if _, err := os.Stat("/proc/sys/net/ipv6/conf/" + name); err != nil {
		return nil
	}
	return setIPv6Conf(name, "accept_dad", "0")
}

// Addrs returns the global-scope addresses of family (netlink.FAMILY_V4 or
// FAMILY_V6) on l.
func Addrs(l netlink.Link, family int) ([]netip.Prefix, error) {
	addrs, err := netlink.AddrList(l, family)
	if err != nil {
		return nil, fmt.Errorf("list addresses of %s: %w", l.Attrs().Name, err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if a.Scope != unix.RT_SCOPE_UNIVERSE {
			continue
		}
		if p, ok := prefixOf(a.IPNet); ok {
			out = append(out, p)
		}
	}
	return out, nil
}

// AddAddr adds p to l; an address already there is not an error. An IPv6
// address skips duplicate address detection (addr): podnet's IPAM already
// made it unique, and a tentative gateway or pod address would drop the
// first second of every pod's traffic.
func AddAddr(l netlink.Link, p netip.Prefix) error {
	if err := netlink.AddrAdd(l, addr(p)); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("add %s to %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// DelAddr removes p from l; an address already gone is not an error.
func DelAddr(l netlink.Link, p netip.Prefix) error {
	if err := netlink.AddrDel(l, &netlink.Addr{IPNet: ipNet(p)}); err != nil && !errors.Is(err, unix.EADDRNOTAVAIL) {
		return fmt.Errorf("remove %s from %s: %w", p, l.Attrs().Name, err)
	}
	return nil
}

// SetMTU sets l's MTU if it differs.
func SetMTU(l netlink.Link, mtu int) error {
	if l.Attrs().MTU == mtu {
		return nil
	}
	if err := netlink.LinkSetMTU(l, mtu); err != nil {
		return fmt.Errorf("set MTU of %s to %d: %w", l.Attrs().Name, mtu, err)
	}
	l.Attrs().MTU = mtu
	return nil
}

// SetMAC sets l's hardware address if it differs.
func SetMAC(l netlink.Link, mac net.HardwareAddr) error {
	if l.Attrs().HardwareAddr.String() == mac.String() {
		return nil
	}
	if err := netlink.LinkSetHardwareAddr(l, mac); err != nil {
		return fmt.Errorf("set MAC of %s: %w", l.Attrs().Name, err)
	}
	return nil
}

// VethOptions describe one pod's veth pair.
type VethOptions struct {
	HostName string
	HostMAC  net.HardwareAddr
	PodName  string
	PodMAC   net.HardwareAddr
	PodNS    ns.NetNS
	MTU      int
	// Bridge is the master of the host side.
	Bridge netlink.Link
	// Hairpin lets a pod reach itself through a Service VIP (traffic goes
	// out of the port and back in).
	Hairpin bool
}

// ErrPodIfExists is returned by AddVeth when the pod namespace already has an
// interface of the wanted name that is not podnet's.
var ErrPodIfExists = errors.New("interface already exists in the pod namespace")

// AddVeth creates the pair in one request, the pod side directly in the pod
// namespace under its final name, the host side up and enslaved to the
// bridge. A leftover pair of the same name (a repeated ADD) is replaced.
func AddVeth(o VethOptions) (*netlink.Veth, error) {
	v := &netlink.Veth{
		LinkAttrs: netlink.LinkAttrs{
			Name:         o.HostName,
			MTU:          o.MTU,
			HardwareAddr: o.HostMAC,
			Flags:        net.FlagUp,
			TxQLen:       -1,
			MasterIndex:  o.Bridge.Attrs().Index,
		},
		PeerName:         o.PodName,
		PeerHardwareAddr: o.PodMAC,
		PeerNamespace:    netlink.NsFd(int(o.PodNS.Fd())),
		PeerTxQLen:       -1,
	}
	err := netlink.LinkAdd(v)
	if errors.Is(err, unix.EEXIST) {
		// Either our host side is left from an earlier ADD of this
		// attachment (deleting it removes its pod side too), or the pod
		// already has an interface of that name.
		existed, derr := DelByName(o.HostName)
		if derr != nil {
			return nil, derr
		}
		if !existed {
			return nil, fmt.Errorf("create veth %s: %s: %w", o.HostName, o.PodName, ErrPodIfExists)
		}
		v.Index = 0
		err = netlink.LinkAdd(v)
		if errors.Is(err, unix.EEXIST) {
			return nil, fmt.Errorf("create veth %s: %s: %w", o.HostName, o.PodName, ErrPodIfExists)
		}
	}
	if err != nil {
		// LinkAdd may have created the pair and failed enslaving it.
		DelByName(o.HostName)
		return nil, fmt.Errorf("create veth %s (pod side %s): %w", o.HostName, o.PodName, err)
	}
	if o.Hairpin {
		if err := netlink.LinkSetHairpin(v, true); err != nil {
			return v, fmt.Errorf("set hairpin on %s: %w", o.HostName, err)
		}
	}
	return v, nil
}

// DelByName deletes the link called name, reporting whether it existed.
func DelByName(name string) (bool, error) {
	l, err := netlink.LinkByName(name)
	if NotFound(err) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("look up %s: %w", name, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		if NotFound(err) {
			return false, nil
		}
		return true, fmt.Errorf("delete %s: %w", name, err)
	}
	return true, nil
}

// PodIface is the configuration of the pod side of a veth.
type PodIface struct {
	Name string
	// Addrs holds one address per family of the node's podCIDRs.
	Addrs []PodAddr
}

// PodAddr is one of a pod's addresses and the gateway of its family.
type PodAddr struct {
	Addr    netip.Prefix // the pod address with the podCIDR's length
	Gateway netip.Addr
}

// ConfigurePod gives the pod interface its addresses, brings it up and adds
// a default route via the gateway of each family, inside podNS. With an
// IPv6 address the interface ignores router advertisements: its routes are
// podnet's, and a rogue RA from another pod on the bridge must not add one.
func ConfigurePod(podNS ns.NetNS, p PodIface) error {
	return podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(p.Name)
		if err != nil {
			return fmt.Errorf("look up %s in pod: %w", p.Name, err)
		}
		for _, a := range p.Addrs {
			if a.Addr.Addr().Is6() {
				if err := setIPv6Conf(p.Name, "accept_ra", "0"); err != nil {
					return err
				}
			}
			if err := netlink.AddrAdd(l, addr(a.Addr)); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add %s to %s in pod: %w", a.Addr, p.Name, err)
			}
		}
		if err := netlink.LinkSetUp(l); err != nil {
			return fmt.Errorf("set %s up in pod: %w", p.Name, err)
		}
		for _, a := range p.Addrs {
			route := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: a.Gateway.AsSlice(), Dst: DefaultDst(a.Gateway)}
			if err := netlink.RouteAdd(route); err != nil && !errors.Is(err, unix.EEXIST) {
				return fmt.Errorf("add default route via %s in pod: %w", a.Gateway, err)
			}
		}
		return nil
	})
}

// setIPv6Conf writes net.ipv6.conf.IFACE.KEY in the calling thread's
// network namespace (/proc/sys/net follows the opener's namespace).
func setIPv6Conf(iface, key, value string) error {
	path := "/proc/sys/net/ipv6/conf/" + iface + "/" + key
	if err := os.WriteFile(path, []byte(value), 0o644); err != nil {
		return fmt.Errorf("set %s to %s: %w", path, value, err)
	}
	return nil
}

// IPv6Conf reads net.ipv6.conf.IFACE.KEY in the calling thread's network
// namespace.
func IPv6Conf(iface, key string) (string, error) {
	b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + iface + "/" + key)
	return strings.TrimSpace(string(b)), err
}

// addr is p as a netlink address; an IPv6 one without duplicate address
// detection.
func addr(p netip.Prefix) *netlink.Addr {
	a := &netlink.Addr{IPNet: ipNet(p)}
	if p.Addr().Is6() {
		a.Flags = unix.IFA_F_NODAD
	}
	return a
}

// PodState is what CHECK compares against the result of ADD.
type PodState struct {
	MTU   int
	MAC   string
	Up    bool
	Addrs []netip.Prefix // global addresses of both families
	// Gateways holds the gateway of each family's default route via the
	// interface, IPv4 first.
	Gateways []netip.Addr
	// AcceptRA is net.ipv6.conf.IFACE.accept_ra ("" without IPv6).
	AcceptRA string
}

// DefaultGW is the gateway of the default route of a's family, invalid if
// there is none via the interface.
func (st PodState) DefaultGW(a netip.Addr) netip.Addr {
	for _, gw := range st.Gateways {
		if gw.Is4() == a.Is4() {
			return gw
		}
	}
	return netip.Addr{}
}

// InspectPod reads the state of interface name inside podNS, both families.
func InspectPod(podNS ns.NetNS, name string) (PodState, error) {
	var st PodState
	err := podNS.Do(func(ns.NetNS) error {
		l, err := netlink.LinkByName(name)
		if err != nil {
			return fmt.Errorf("interface %s in pod: %w", name, err)
		}
		st.MTU = l.Attrs().MTU
		st.MAC = l.Attrs().HardwareAddr.String()
		st.Up = l.Attrs().Flags&net.FlagUp != 0
		if st.Addrs, err = Addrs(l, netlink.FAMILY_ALL); err != nil {
			return err
		}
		st.AcceptRA, _ = IPv6Conf(name, "accept_ra")
		for _, family := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			routes, err := netlink.RouteList(l, family)
			if err != nil {
				return fmt.Errorf("list routes of %s in pod: %w", name, err)
			}
			for _, r := range routes {
				if isDefault(r.Dst) && r.Gw != nil {
					gw, _ := netip.AddrFromSlice(r.Gw)
					st.Gateways = append(st.Gateways, gw.Unmap())
					break
				}
			}
		}
		return nil
	})
	return st, err
}

// HostVeths returns the host-side veths podnet created (by name shape).
func HostVeths() ([]netlink.Link, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	var out []netlink.Link
	for _, l := range links {
		if _, ok := l.(*netlink.Veth); ok && IsHostVethName(l.Attrs().Name) {
			out = append(out, l)
		}
	}
	return out, nil
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}

// DefaultDst is the default route's destination in a's family: 0.0.0.0/0
// or ::/0.
func DefaultDst(a netip.Addr) *net.IPNet {
	if a.Is4() {
		return &net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
	}
	return &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
}

func isDefault(dst *net.IPNet) bool {
	if dst == nil {
		return true
	}
	ones, _ := dst.Mask.Size()
	return ones == 0
}
