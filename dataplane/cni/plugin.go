// Package cni is the podnet CNI plugin: the verbs a container runtime execs
// it for (ADD, DEL, CHECK, STATUS, GC; VERSION is answered by skel).
//
// ADD attaches a pod to the node bridge (cbr0 by default) with a veth pair
// and an address from the node's podCIDR, which proxyd publishes in the node
// config. The pod routes everything via the bridge's address (the first of
// the podCIDR); proxyd routes the node's podCIDR between nodes.
//
// The IPAM store lock is held only while an address is taken (and, when the
// bridge's address must change, while that is done, so a podCIDR change and
// concurrent ADDs cannot race); the veth and the pod side are set up outside
// it. Every step after the address was taken is undone if a later one fails.
package cni

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"
	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/ipam"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/nodeconfig"
)

// VersionInfo lists the CNI spec versions the plugin speaks.
var VersionInfo = version.PluginSupports("0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Funcs are the verbs for skel.PluginMainFuncs, changing the kernel over
// netlink.
func Funcs() skel.CNIFuncs {
	p := &plugin{host: netlinkHost{}}
	return skel.CNIFuncs{Add: p.cmdAdd, Del: p.cmdDel, Check: p.cmdCheck, Status: cmdStatus, GC: p.cmdGC}
}

// plugin runs the verbs against a nodeHost.
type plugin struct {
	host nodeHost
}

// nodeHost is every change the verbs make to the node and its pods, so
// tests can make each one fail; netlinkHost is the real one. Reads that only
// CHECK needs go to netlink directly.
type nodeHost interface {
	OpenNetNS(path string) (ns.NetNS, error)
	// Bridge returns the bridge, creating it up with mtu and mac if missing.
	Bridge(name string, mtu int, mac net.HardwareAddr) (netlink.Link, error)
	SetMTU(l netlink.Link, mtu int) error
	SetMAC(l netlink.Link, mac net.HardwareAddr) error
	Addrs(l netlink.Link, family int) ([]netip.Prefix, error)
	AddAddr(l netlink.Link, p netip.Prefix) error
	DelAddr(l netlink.Link, p netip.Prefix) error
	AddVeth(o link.VethOptions) error
	// DelLink deletes a link by name, reporting whether it existed.
	DelLink(name string) (bool, error)
	// HostVeths lists the names of the host-side veths podnet made.
	HostVeths() ([]string, error)
	ConfigurePod(podNS ns.NetNS, p link.PodIface) error
	EnableForwarding(v4 bool) error
}

type netlinkHost struct{}

func (netlinkHost) OpenNetNS(path string) (ns.NetNS, error) { return ns.GetNS(path) }
func (netlinkHost) Bridge(name string, mtu int, mac net.HardwareAddr) (netlink.Link, error) {
	return link.Bridge(name, mtu, mac)
}
func (netlinkHost) SetMTU(l netlink.Link, mtu int) error              { return link.SetMTU(l, mtu) }
func (netlinkHost) SetMAC(l netlink.Link, mac net.HardwareAddr) error { return link.SetMAC(l, mac) }
func (netlinkHost) Addrs(l netlink.Link, family int) ([]netip.Prefix, error) {
	return link.Addrs(l, family)
}
func (netlinkHost) AddAddr(l netlink.Link, p netip.Prefix) error { return link.AddAddr(l, p) }
func (netlinkHost) DelAddr(l netlink.Link, p netip.Prefix) error { return link.DelAddr(l, p) }
func (netlinkHost) AddVeth(o link.VethOptions) error {
	_, err := link.AddVeth(o)
	return err
}
func (netlinkHost) DelLink(name string) (bool, error) { return link.DelByName(name) }
func (netlinkHost) HostVeths() ([]string, error) {
	veths, err := link.HostVeths()
	names := make([]string, 0, len(veths))
	for _, v := range veths {
		names = append(names, v.Attrs().Name)
	}
	return names, err
}
func (netlinkHost) ConfigurePod(podNS ns.NetNS, p link.PodIface) error {
	return link.ConfigurePod(podNS, p)
}
func (netlinkHost) EnableForwarding(v4 bool) error { return enableForwarding(v4) }

// run decodes the config, opens the log and runs one verb, logging how it
// went.
func run(verb string, args *skel.CmdArgs, fn func(*Config, *slog.Logger) error) error {
	c, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	log, closeLog := c.logger()
	defer closeLog()
	log = log.With("verb", verb, "container", args.ContainerID, "ifname", args.IfName)
	start := time.Now()
	err = fn(c, log)
	if err != nil {
		log.Error("failed", "err", err, "took", time.Since(start))
		return err
	}
	log.Info("done", "took", time.Since(start))
	return nil
}

// logger opens the log file. Without one, or if it cannot be opened, only
// warnings and errors reach stderr, which the runtime keeps on failure.
func (c *Config) logger() (*slog.Logger, func()) {
	stderr := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	if c.LogFile == "" {
		return stderr, func() {}
	}
	if err := os.MkdirAll(filepath.Dir(c.LogFile), 0o755); err != nil {
		stderr.Warn("cannot create log directory", "err", err)
		return stderr, func() {}
	}
	f, err := os.OpenFile(c.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		stderr.Warn("cannot open log file", "err", err)
		return stderr, func() {}
	}
	var h slog.Handler = slog.NewTextHandler(f, nil)
	if c.LogFormat == "json" {
		h = slog.NewJSONHandler(f, nil)
	}
	return slog.New(h).With("pid", os.Getpid()), func() { f.Close() }
}

func (c *Config) ipamOptions() ipam.Options {
	return ipam.Options{Dir: c.storeDir(), BootIDFile: c.BootIDFile}
}

// openStore opens the IPAM store; a lock held too long is "try again".
func (c *Config) openStore(log *slog.Logger) (*ipam.Txn, error) {
	txn, err := ipam.Open(c.ipamOptions())
	if errors.Is(err, ipam.ErrLocked) {
		return nil, types.NewError(types.ErrTryAgainLater, err.Error(), "")
	}
	if err != nil {
		return nil, err
	}
	if r := txn.Rebooted(); len(r) > 0 {
		log.Info("released allocations from before a reboot", "count", len(r))
	}
	return txn, nil
}

// resolveNetwork wraps Config.network with the CNI error codes ADD needs.
func (c *Config) resolveNetwork() (podNetwork, error) {
	pn, err := c.network()
	if errors.Is(err, nodeconfig.ErrNotFound) {
		return pn, types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("node config %s does not exist yet (proxyd writes it once the node has a podCIDR)", c.NodeConfig), "")
	}
	if err != nil {
		return pn, types.NewError(types.ErrInvalidNetworkConfig, err.Error(), "")
	}
	return pn, nil
}

func (p *plugin) cmdAdd(args *skel.CmdArgs) error {
	var res *current.Result
	var cniVersion string
	err := run("ADD", args, func(c *Config, log *slog.Logger) error {
		var err error
		res, err = p.add(c, args, log)
		cniVersion = c.CNIVersion
		return err
	})
	if err != nil {
		return err
	}
	return types.PrintResult(res, cniVersion)
}

func (p *plugin) add(c *Config, args *skel.CmdArgs, log *slog.Logger) (*current.Result, error) {
	pn, err := c.resolveNetwork()
	if err != nil {
		return nil, err
	}
	podNS, err := p.host.OpenNetNS(args.Netns)
	if err != nil {
		return nil, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %s: %v", args.Netns, err), "")
	}
	defer podNS.Close()

	att := ipam.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	t0 := time.Now()
	addrs, fresh, br, err := p.allocate(c, pn, att, log)
	if err != nil {
		return nil, err
	}
	hostName := link.HostVethName(args.ContainerID, args.IfName)
	success := false
	defer func() {
		if success {
			return
		}
		if _, err := p.host.DelLink(hostName); err != nil {
			log.Warn("rollback: delete host veth", "err", err)
		}
		if fresh {
			if err := c.release(att, log); err != nil {
				log.Warn("rollback: release addresses", "addrs", addrs, "err", err)
			}
		}
	}()

	t1 := time.Now()
	hostMAC, podMAC := link.RandomMAC(), link.MACFromIP(addrs[0].Addr.Addr())
	err = p.host.AddVeth(link.VethOptions{
		HostName: hostName, HostMAC: hostMAC,
		PodName: args.IfName, PodMAC: podMAC, PodNS: podNS,
		MTU: pn.MTU, Bridge: br, Hairpin: c.HairpinMode,
	})
	if err != nil {
		return nil, err
	}
	t2 := time.Now()
	if err := p.host.ConfigurePod(podNS, link.PodIface{Name: args.IfName, Addrs: addrs}); err != nil {
		return nil, err
	}
	for _, a := range addrs {
		if err := p.host.EnableForwarding(a.Addr.Addr().Is4()); err != nil {
			return nil, err
		}
	}
	success = true
	log.Info("attached", "addrs", addrs, "hostVeth", hostName, "fresh", fresh,
		"ipam", t1.Sub(t0), "veth", t2.Sub(t1), "pod", time.Since(t2))

	res := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{
			{Name: br.Attrs().Name, Mac: br.Attrs().HardwareAddr.String(), Mtu: pn.MTU},
			{Name: hostName, Mac: hostMAC.String(), Mtu: pn.MTU},
			{Name: args.IfName, Mac: podMAC.String(), Mtu: pn.MTU, Sandbox: args.Netns},
		},
	}
	for _, a := range addrs {
		ip := a.Addr.Addr()
		res.IPs = append(res.IPs, &current.IPConfig{
			Interface: current.Int(2),
			Address:   net.IPNet{IP: ip.AsSlice(), Mask: net.CIDRMask(a.Addr.Bits(), ip.BitLen())},
			Gateway:   a.Gateway.AsSlice(),
		})
		res.Routes = append(res.Routes, &types.Route{Dst: *link.DefaultDst(ip), GW: a.Gateway.AsSlice()})
	}
	return res, nil
}

// allocate takes (or finds) the attachment's address of each family, in
// the order of the node's podCIDRs (IPv4 first), in one transaction: a
// crash leaves both or neither. The bridge is made
// and checked before the store lock is taken, so the common case holds the
// lock only for the allocation and its write; a bridge address that needs
// changing is changed under the lock, where the allocations it depends on
// cannot move.
func (p *plugin) allocate(c *Config, pn podNetwork, att ipam.Attachment, log *slog.Logger) ([]link.PodAddr, bool, netlink.Link, error) {
	br, ready, err := p.bridge(c, pn)
	if err != nil {
		return nil, false, nil, err
	}
	txn, err := c.openStore(log)
	if err != nil {
		return nil, false, nil, err
	}
	defer txn.Close()
	var addrs []link.PodAddr
	anyFresh := false
	for _, cidr := range pn.PodCIDRs {
		addr, fresh, err := txn.Allocate(cidr, att)
		if errors.Is(err, ipam.ErrRangeFull) {
			return nil, false, nil, types.NewError(types.ErrTryAgainLater, "allocate address: "+err.Error(), "")
		}
		if err != nil {
			return nil, false, nil, err
		}
		anyFresh = anyFresh || fresh
		addrs = append(addrs, link.PodAddr{Addr: netip.PrefixFrom(addr, cidr.Bits()), Gateway: ipam.Gateway(cidr)})
	}
	if !ready {
		for _, cidr := range pn.PodCIDRs {
			if err := p.fixBridgeAddrs(c, txn, cidr, br, log); err != nil {
				return nil, false, nil, err
			}
		}
		if err := p.fixBridgeMAC(br, pn); err != nil {
			return nil, false, nil, err
		}
	}
	if err := txn.Commit(); err != nil {
		return nil, false, nil, err
	}
	if err := txn.Close(); err != nil {
		return nil, false, nil, err
	}
	return addrs, anyFresh, br, nil
}

func family(a netip.Addr) int {
	if a.Is6() {
		return netlink.FAMILY_V6
	}
	return netlink.FAMILY_V4
}

// bridgeMAC is the bridge's MAC: derived from the first gateway (the IPv4
// one on a dual-stack node).
func bridgeMAC(pn podNetwork) net.HardwareAddr { return link.MACFromIP(ipam.Gateway(pn.PodCIDRs[0])) }

// bridge creates the bridge if missing and keeps its MTU in step with the
// node's (the gateway side of every pod's traffic uses it). ready reports
// whether its only address of each family already is that family's
// gateway.
func (p *plugin) bridge(c *Config, pn podNetwork) (br netlink.Link, ready bool, err error) {
	br, err = p.host.Bridge(c.Bridge, pn.MTU, bridgeMAC(pn))
	if err != nil {
		return nil, false, err
	}
	if err := p.host.SetMTU(br, pn.MTU); err != nil {
		return nil, false, err
	}
	ready = true
	for _, cidr := range pn.PodCIDRs {
		gw := ipam.Gateway(cidr)
		addrs, err := p.host.Addrs(br, family(gw))
		if err != nil {
			return nil, false, err
		}
		ready = ready && len(addrs) == 1 && addrs[0] == netip.PrefixFrom(gw, cidr.Bits())
	}
	return br, ready, nil
}

// fixBridgeAddrs gives the bridge the gateway address of cidr's family.
// An address from an earlier podCIDR of that family is replaced once no
// pod holds an address in its range; while some do, ADD fails with "try
// again".
func (p *plugin) fixBridgeAddrs(c *Config, txn *ipam.Txn, cidr netip.Prefix, br netlink.Link, log *slog.Logger) error {
	gw := ipam.Gateway(cidr)
	addrs, err := p.host.Addrs(br, family(gw)) // again: another ADD may have fixed them
	if err != nil {
		return err
	}
	want := netip.PrefixFrom(gw, cidr.Bits())
	have := false
	for _, a := range addrs {
		if a == want {
			have = true
			continue
		}
		var users []string
		for _, al := range txn.Allocations() {
			if a.Masked().Contains(al.Addr) && !cidr.Contains(al.Addr) {
				users = append(users, al.Addr.String()+" ("+al.Attachment.String()+")")
			}
		}
		if len(users) > 0 {
			return types.NewError(types.ErrTryAgainLater, fmt.Sprintf(
				"bridge %s has address %s from an earlier podCIDR, not %s; %d pods still use that range (%s), it is replaced once they are deleted",
				c.Bridge, a, want, len(users), strings.Join(users[:min(len(users), 3)], ", ")), "")
		}
		log.Info("replacing stale bridge address", "bridge", c.Bridge, "old", a, "new", want)
		if err := p.host.DelAddr(br, a); err != nil {
			return err
		}
	}
	if !have {
		return p.host.AddAddr(br, want)
	}
	return nil
}

// fixBridgeMAC gives the bridge the MAC its first gateway derives.
func (p *plugin) fixBridgeMAC(br netlink.Link, pn podNetwork) error {
	mac := bridgeMAC(pn)
	if err := p.host.SetMAC(br, mac); err != nil {
		return err
	}
	br.Attrs().HardwareAddr = mac
	return nil
}

func (c *Config) release(att ipam.Attachment, log *slog.Logger) error {
	txn, err := c.openStore(log)
	if err != nil {
		return err
	}
	defer txn.Close()
	if addrs := txn.Release(att); len(addrs) > 0 {
		log.Info("released", "addrs", addrs)
	}
	if err := txn.Commit(); err != nil {
		return err
	}
	return txn.Close()
}

// enableForwarding turns on IP forwarding in the node namespace; the
// gateway routes the pods' traffic.
func enableForwarding(v4 bool) error {
	path := "/proc/sys/net/ipv4/ip_forward"
	if !v4 {
		path = "/proc/sys/net/ipv6/conf/all/forwarding"
	}
	cur, err := os.ReadFile(path)
	if err == nil && strings.TrimSpace(string(cur)) == "1" {
		return nil
	}
	if err := os.WriteFile(path, []byte("1"), 0o644); err != nil {
		return fmt.Errorf("enable forwarding: %w", err)
	}
	return nil
}

func (p *plugin) cmdDel(args *skel.CmdArgs) error {
	return run("DEL", args, func(c *Config, log *slog.Logger) error {
		return p.del(c, args, log)
	})
}

func (p *plugin) del(c *Config, args *skel.CmdArgs, log *slog.Logger) error {
	// The link goes first: an address is never free while a live interface
	// still holds it. Deleting the host side removes the pod side too, so a
	// vanished netns needs no special case.
	hostName := link.HostVethName(args.ContainerID, args.IfName)
	existed, err := p.host.DelLink(hostName)
	if err != nil {
		return err
	}
	if existed {
		log.Info("deleted host veth", "name", hostName)
	}
	return c.release(ipam.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}, log)
}

func (p *plugin) cmdCheck(args *skel.CmdArgs) error {
	return run("CHECK", args, func(c *Config, log *slog.Logger) error {
		return p.check(c, args, log)
	})
}

func (p *plugin) check(c *Config, args *skel.CmdArgs, log *slog.Logger) error {
	if c.PrevResult == nil {
		return types.NewError(types.ErrInvalidNetworkConfig, "CHECK needs prevResult, the config has none", "")
	}
	prev, err := current.NewResultFromResult(c.PrevResult)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "convert prevResult: "+err.Error(), "")
	}
	pn, err := c.resolveNetwork()
	if err != nil {
		return err
	}
	want, err := checkWanted(prev, args.IfName)
	if err != nil {
		return err
	}
	want.podCIDRs, want.mtu, want.bridge = pn.PodCIDRs, pn.MTU, c.Bridge
	want.hostVeth = link.HostVethName(args.ContainerID, args.IfName)
	want.att = ipam.Attachment{ContainerID: args.ContainerID, IfName: args.IfName}
	seen, err := p.observe(c, args, want, log)
	if err != nil {
		return err
	}
	if diffs := compareCheck(want, seen); len(diffs) > 0 {
		return fmt.Errorf("CHECK %s: %s", want.att, strings.Join(diffs, "; "))
	}
	return nil
}

// checkWant is the state CHECK expects: prevResult's, and the network's.
type checkWant struct {
	att      ipam.Attachment
	ifName   string
	addrs    []wantAddr // one per family, as prevResult lists them
	mac      string     // "": prevResult names none
	podCIDRs []netip.Prefix
	mtu      int
	bridge   string
	hostVeth string
}

// wantAddr is one of the pod's addresses in prevResult.
type wantAddr struct {
	addr   netip.Addr
	prefix netip.Prefix // addr with the pod's prefix length
	gw     netip.Addr   // invalid: prevResult names none
}

// checkSeen is the pod's state as CHECK observed it. An error field says
// that part could not be read.
type checkSeen struct {
	ipamAddrs               []netip.Addr // what the store holds for the attachment
	hostErr                 error        // the host veth
	bridgeErr               error
	hostMaster, bridgeIndex int
	hostMTU                 int
	hostUp                  bool
	podErr                  error
	pod                     link.PodState
}

// checkWanted reads the pod interface and its addresses from prevResult.
func checkWanted(prev *current.Result, ifName string) (checkWant, error) {
	podIdx := -1
	for i, ifc := range prev.Interfaces {
		if ifc.Name == ifName && ifc.Sandbox != "" {
			podIdx = i
		}
	}
	if podIdx < 0 {
		return checkWant{}, fmt.Errorf("CHECK: prevResult lists no interface %s with a sandbox", ifName)
	}
	w := checkWant{ifName: ifName, mac: prev.Interfaces[podIdx].Mac}
	for _, ipc := range prev.IPs {
		if ipc.Interface == nil || *ipc.Interface != podIdx {
			continue
		}
		var a wantAddr
		a.addr, _ = netip.AddrFromSlice(ipc.Address.IP)
		a.addr = a.addr.Unmap()
		ones, _ := ipc.Address.Mask.Size()
		a.prefix = netip.PrefixFrom(a.addr, ones)
		a.gw, _ = netip.AddrFromSlice(ipc.Gateway)
		a.gw = a.gw.Unmap()
		w.addrs = append(w.addrs, a)
	}
	if len(w.addrs) == 0 {
		return checkWant{}, fmt.Errorf("CHECK: prevResult has no address for interface %s", ifName)
	}
	return w, nil
}

// observe reads what CHECK compares: the IPAM store, the host veth and
// bridge, the pod's interface. Only a pod netns that cannot be opened is
// an error; what is missing is recorded for compareCheck.
func (p *plugin) observe(c *Config, args *skel.CmdArgs, want checkWant, log *slog.Logger) (checkSeen, error) {
	var seen checkSeen
	txn, err := c.openStore(log)
	if err != nil {
		return seen, err
	}
	seen.ipamAddrs = txn.Addrs(want.att)
	txn.Close()

	if hl, err := netlink.LinkByName(want.hostVeth); err != nil {
		seen.hostErr = err
	} else {
		seen.hostMaster, seen.hostMTU, seen.hostUp = hl.Attrs().MasterIndex, hl.Attrs().MTU, hl.Attrs().Flags&net.FlagUp != 0
		if br, err := netlink.LinkByName(want.bridge); err != nil {
			seen.bridgeErr = err
		} else {
			seen.bridgeIndex = br.Attrs().Index
		}
	}

	podNS, err := p.host.OpenNetNS(args.Netns)
	if err != nil {
		return seen, types.NewError(types.ErrInvalidEnvironmentVariables, fmt.Sprintf("CNI_NETNS %s: %v", args.Netns, err), "")
	}
	defer podNS.Close()
	seen.pod, seen.podErr = link.InspectPod(podNS, args.IfName)
	return seen, nil
}

// compareCheck lists every way seen differs from want, in the order an
// operator would look: IPAM, the host side, the pod side; each address
// family on its own. Pure.
func compareCheck(want checkWant, seen checkSeen) []string {
	var diffs []string
	for _, a := range want.addrs {
		diffs = append(diffs, compareIPAM(want, a, seen)...)
	}
	if len(want.addrs) != len(want.podCIDRs) {
		diffs = append(diffs, fmt.Sprintf("prevResult has %d addresses, the node's podCIDRs %v want one per family", len(want.addrs), want.podCIDRs))
	}
	diffs = append(diffs, compareHost(want, seen)...)
	return append(diffs, comparePod(want, seen)...)
}

// compareIPAM compares one address of prevResult with the store and the
// podCIDR of its family.
func compareIPAM(want checkWant, a wantAddr, seen checkSeen) []string {
	var diffs []string
	f := ipfamily.Of(a.addr)
	held := f.Addrs(seen.ipamAddrs)
	switch {
	case len(held) == 0:
		diffs = append(diffs, fmt.Sprintf("ipam holds no %v address for %s (prevResult has %s)", f, want.att, a.addr))
	case held[0] != a.addr:
		diffs = append(diffs, fmt.Sprintf("ipam holds %s for %s, prevResult has %s", held[0], want.att, a.addr))
	}
	cidrs := f.Prefixes(want.podCIDRs)
	if len(cidrs) == 0 || !cidrs[0].Contains(a.addr) {
		diffs = append(diffs, fmt.Sprintf("address %s is outside the podCIDR %v", a.addr, cidrs))
	}
	return diffs
}

// compareHost compares the host veth and its bridge.
func compareHost(want checkWant, seen checkSeen) []string {
	if seen.hostErr != nil {
		return []string{fmt.Sprintf("host veth %s: %v", want.hostVeth, seen.hostErr)}
	}
	var diffs []string
	switch {
	case seen.bridgeErr != nil:
		diffs = append(diffs, fmt.Sprintf("bridge %s: %v", want.bridge, seen.bridgeErr))
	case seen.hostMaster != seen.bridgeIndex:
		diffs = append(diffs, fmt.Sprintf("host veth %s is not attached to %s", want.hostVeth, want.bridge))
	}
	if seen.hostMTU != want.mtu {
		diffs = append(diffs, fmt.Sprintf("host veth %s has MTU %d, want %d", want.hostVeth, seen.hostMTU, want.mtu))
	}
	if !seen.hostUp {
		diffs = append(diffs, fmt.Sprintf("host veth %s is down", want.hostVeth))
	}
	return diffs
}

// comparePod compares the pod's interface, addresses and default routes.
func comparePod(want checkWant, seen checkSeen) []string {
	if seen.podErr != nil {
		return []string{seen.podErr.Error()}
	}
	st, name := seen.pod, want.ifName
	var diffs []string
	if st.MTU != want.mtu {
		diffs = append(diffs, fmt.Sprintf("%s in pod has MTU %d, want %d", name, st.MTU, want.mtu))
	}
	if want.mac != "" && !strings.EqualFold(want.mac, st.MAC) {
		diffs = append(diffs, fmt.Sprintf("%s in pod has MAC %s, prevResult has %s", name, st.MAC, want.mac))
	}
	if !st.Up {
		diffs = append(diffs, fmt.Sprintf("%s in pod is down", name))
	}
	for _, a := range want.addrs {
		diffs = append(diffs, comparePodAddr(name, a, st)...)
	}
	return diffs
}

// comparePodAddr compares one of the pod's addresses and its family's
// default route (and, for IPv6, that router advertisements are ignored).
func comparePodAddr(name string, a wantAddr, st link.PodState) []string {
	var diffs []string
	if !slices.Contains(st.Addrs, a.prefix) {
		diffs = append(diffs, fmt.Sprintf("%s in pod has addresses %v, want %s", name, st.Addrs, a.prefix))
	}
	if gw := st.DefaultGW(a.addr); a.gw.IsValid() && gw != a.gw {
		if gw.IsValid() {
			diffs = append(diffs, fmt.Sprintf("pod's default route is via %s, want %s", gw, a.gw))
		} else {
			diffs = append(diffs, fmt.Sprintf("pod has no default route via %s on %s", a.gw, name))
		}
	}
	if a.addr.Is6() && st.AcceptRA != "0" {
		diffs = append(diffs, fmt.Sprintf("%s in pod accepts router advertisements (accept_ra %q, want \"0\")", name, st.AcceptRA))
	}
	return diffs
}

func cmdStatus(args *skel.CmdArgs) error {
	return run("STATUS", args, func(c *Config, log *slog.Logger) error {
		if len(c.Subnets) == 0 {
			if _, err := nodeconfig.Read(c.NodeConfig); err != nil {
				msg := err.Error()
				if errors.Is(err, nodeconfig.ErrNotFound) {
					msg = fmt.Sprintf("node config %s does not exist yet (proxyd writes it once the node has a podCIDR)", c.NodeConfig)
				}
				return types.NewError(types.ErrPluginNotAvailable, msg, "")
			}
		}
		if err := os.MkdirAll(c.storeDir(), 0o755); err != nil {
			return types.NewError(types.ErrPluginNotAvailable, "ipam store: "+err.Error(), "")
		}
		return nil
	})
}

func (p *plugin) cmdGC(args *skel.CmdArgs) error {
	return run("GC", args, func(c *Config, log *slog.Logger) error {
		return p.gc(c, log)
	})
}

// gc releases every allocation and deletes every host veth that belongs to
// no valid attachment, going on past errors and reporting them all.
func (p *plugin) gc(c *Config, log *slog.Logger) error {
	if !c.hasValidAttachments {
		return types.NewError(types.ErrInvalidNetworkConfig,
			"GC config has no cni.dev/valid-attachments; refusing to treat every attachment as stale", "")
	}
	valid := make(map[ipam.Attachment]bool, len(c.ValidAttachments))
	validVeths := make(map[string]bool, len(c.ValidAttachments))
	for _, a := range c.ValidAttachments {
		valid[ipam.Attachment{ContainerID: a.ContainerID, IfName: a.IfName}] = true
		validVeths[link.HostVethName(a.ContainerID, a.IfName)] = true
	}
	var errs []error
	// Veths first, as in DEL: no address is freed while its interface lives.
	veths, err := p.host.HostVeths()
	if err != nil {
		errs = append(errs, err)
	}
	for _, name := range veths {
		if validVeths[name] {
			continue
		}
		if _, err := p.host.DelLink(name); err != nil {
			errs = append(errs, err)
			continue
		}
		log.Info("gc: deleted host veth", "name", name)
	}
	txn, err := c.openStore(log)
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	defer txn.Close()
	dropped := txn.Retain(func(al ipam.Allocation) bool { return valid[al.Attachment] })
	if err := txn.Commit(); err != nil {
		errs = append(errs, err)
	} else if err := txn.Close(); err != nil {
		errs = append(errs, err)
	} else {
		for _, al := range dropped {
			log.Info("gc: released", "addr", al.Addr, "attachment", al.Attachment.String())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("gc: %w", errors.Join(errs...))
	}
	return nil
}
