// Package kubeproxy removes what kube-proxy left on a node, as `kube-proxy
// --cleanup` would, so that podnet's Service proxy can take the node over
// without a moment where Services go unprogrammed: proxyd's own rules go
// in first (its jumps sit ahead of kube-proxy's), then this removes
// kube-proxy's: its iptables chains (every KUBE-* chain but kubelet's own
// KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT) and the rules of other
// chains that jump to them, in both iptables backends and both families;
// its nftables tables (`ip kube-proxy`, `ip6 kube-proxy`); and what its
// IPVS mode leaves: the kube-ipvs0 dummy device, the IPVS virtual servers
// and the KUBE-* ipsets.
//
// Connections kube-proxy set up keep working: their translation lives in
// conntrack, decided by their first packet, and removing rules does not
// touch it, as long as conntrack stays on in the network namespace. The
// kernel turns it off where no rule needs it any more (the last NAT or
// conntrack-matching rule gone), and then those connections stop: so
// podnet's Service rules, which NAT, go in first, and on a node where
// nothing else needs conntrack removing kube-proxy's alone would cut them
// (TestCleanupRealNode keeps flannel's masquerade rule for that reason).
package kubeproxy

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
)

// ChainPrefix starts the name of every iptables chain kube-proxy makes.
const ChainPrefix = "KUBE-"

// NFTTable is the nftables table of kube-proxy's nftables mode, in the ip
// and ip6 families.
const NFTTable = "kube-proxy"

// IPVSDevice is the dummy device kube-proxy's IPVS mode binds Service IPs
// to.
const IPVSDevice = "kube-ipvs0"

// kubeletChains are kubelet's, not kube-proxy's: kubelet watches them to
// tell when the tables were flushed and recreates them; they stay.
var kubeletChains = map[string]bool{"KUBE-KUBELET-CANARY": true, "KUBE-IPTABLES-HINT": true}

// IsKubeProxyChain reports whether chain is one of kube-proxy's.
func IsKubeProxyChain(chain string) bool {
	return strings.HasPrefix(chain, ChainPrefix) && !kubeletChains[chain]
}

// TableRemoval removes kube-proxy's chains from one table.
type TableRemoval struct {
	Table string
	// Restore is iptables-restore --noflush input: the rules of other
	// chains that jump to kube-proxy's are deleted, then its chains are
	// flushed and deleted.
	Restore []byte
	Chains  []string
}

// Removal returns what removes kube-proxy's chains from save
// (iptables-save output, any number of tables), one TableRemoval per table
// that holds any, each its own iptables-restore transaction (a table that
// fails to restore names itself and leaves the others' removal done).
func Removal(save []byte) []TableRemoval {
	var out []TableRemoval
	var cur TableRemoval
	var jumps []string
	flush := func() {
		if len(cur.Chains) == 0 {
			return
		}
		var b bytes.Buffer
		fmt.Fprintf(&b, "*%s\n", cur.Table)
		for _, j := range jumps {
			b.WriteString(j + "\n")
		}
		for _, c := range cur.Chains {
			fmt.Fprintf(&b, ":%s - [0:0]\n", c)
		}
		for _, c := range cur.Chains {
			fmt.Fprintf(&b, "-X %s\n", c)
		}
		b.WriteString("COMMIT\n")
		cur.Restore = b.Bytes()
		out = append(out, cur)
	}
	sc := bufio.NewScanner(bytes.NewReader(save))
	sc.Buffer(make([]byte, 0, 64<<10), 16<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "*"):
			cur, jumps = TableRemoval{Table: line[1:]}, nil
		case line == "COMMIT":
			flush()
			cur, jumps = TableRemoval{}, nil
		case strings.HasPrefix(line, ":"):
			if name, _, _ := strings.Cut(line[1:], " "); IsKubeProxyChain(name) {
				cur.Chains = append(cur.Chains, name)
			}
		case strings.HasPrefix(line, "-A "):
			chain, rule, _ := strings.Cut(line[3:], " ")
			if !IsKubeProxyChain(chain) && IsKubeProxyChain(target(rule)) {
				jumps = append(jumps, "-D "+chain+" "+rule)
			}
		}
	}
	return out
}

// target is the chain a rule jumps or goes to, "" if none.
func target(rule string) string {
	f := strings.Fields(rule)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "-j" || f[i] == "-g" || f[i] == "--jump" || f[i] == "--goto" {
			return f[i+1]
		}
	}
	return ""
}

// Report is what Cleanup removed.
type Report struct {
	// Chains are "iptables-nft/nat/KUBE-SERVICES" and the like.
	Chains    []string
	NFTTables []string // "ip kube-proxy"
	Links     []string
	// IPVS is true when the IPVS virtual servers were cleared; IPSets
	// names the ipsets destroyed.
	IPVS   bool
	IPSets []string
}

// Empty reports whether nothing was removed.
func (r Report) Empty() bool {
	return len(r.Chains)+len(r.NFTTables)+len(r.Links)+len(r.IPSets) == 0 && !r.IPVS
}

// Options say where Cleanup looks; zero values are the node's.
type Options struct {
	// IPTables are the runners to clean; nil: both backends for both
	// families, where their tools are installed.
	IPTables []ipt.Runner
	// NFT opens the nftables connection; nil: nftables.New() in the
	// calling thread's network namespace.
	NFT func() (*nftables.Conn, error)
}

// Cleanup removes kube-proxy's state from the node (the calling thread's
// network namespace) and says what it removed. It goes on past a failure
// and returns every error, each naming what it could not remove.
func Cleanup(o Options) (Report, error) {
	var rep Report
	var errs []error
	runners := o.IPTables
	if runners == nil {
		runners = defaultRunners()
	}
	for _, r := range runners {
		chains, err := cleanIPTables(r)
		rep.Chains = append(rep.Chains, chains...)
		errs = append(errs, err)
	}
	tables, err := cleanNFT(o.NFT)
	rep.NFTTables, errs = tables, append(errs, err)
	ipvs, err := cleanIPVS(&rep)
	rep.IPVS, errs = ipvs, append(errs, err)
	return rep, errors.Join(errs...)
}

// defaultRunners are both backends for both families whose tools exist.
func defaultRunners() []ipt.Runner {
	var out []ipt.Runner
	for _, b := range ipt.Backends {
		for _, f := range []ipfamily.Family{ipfamily.IPv4, ipfamily.IPv6} {
			r := ipt.Runner{Backend: b, Family: f}
			if r.Available() == nil {
				out = append(out, r)
			}
		}
	}
	return out
}

// cleanIPTables removes kube-proxy's chains from one backend and family.
// iptables-save without -t lists only the tables that exist, so nothing
// is created in a backend the node does not use.
func cleanIPTables(r ipt.Runner) ([]string, error) {
	name := r.Command()
	save, err := r.SaveAll()
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", name, err)
	}
	var removed []string
	for _, tr := range Removal(save) {
		if err := r.Restore(tr.Restore); err != nil {
			return removed, fmt.Errorf("remove kube-proxy's chains from %s's %s table: %w", name, tr.Table, err)
		}
		for _, c := range tr.Chains {
			removed = append(removed, name+"/"+tr.Table+"/"+c)
		}
	}
	return removed, nil
}

// cleanNFT deletes kube-proxy's nftables tables.
func cleanNFT(open func() (*nftables.Conn, error)) ([]string, error) {
	if open == nil {
		open = func() (*nftables.Conn, error) { return nftables.New() }
	}
	c, err := open()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	defer c.CloseLasting()
	var removed []string
	for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		tables, err := c.ListTablesOfFamily(fam)
		if err != nil {
			return removed, fmt.Errorf("list nftables tables: %w", err)
		}
		for _, t := range tables {
			if t.Name != NFTTable {
				continue
			}
			c.DelTable(t)
			if err := c.Flush(); err != nil {
				return removed, fmt.Errorf("delete nftables table %s %s: %w", nftFamily(fam), NFTTable, err)
			}
			removed = append(removed, nftFamily(fam)+" "+NFTTable)
		}
	}
	return removed, nil
}

func nftFamily(f nftables.TableFamily) string {
	if f == nftables.TableFamilyIPv6 {
		return "ip6"
	}
	return "ip"
}

// cleanIPVS removes what kube-proxy's IPVS mode leaves when its dummy
// device says it ran: the device, the IPVS virtual servers (all of them,
// as kube-proxy --cleanup does) and its KUBE-* ipsets. The virtual servers
// and ipsets are removed with ipvsadm and ipset; a node without them
// gets an error naming what remains.
func cleanIPVS(rep *Report) (bool, error) {
	l, err := netlink.LinkByName(IPVSDevice)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return false, nil
		}
		return false, fmt.Errorf("look up %s: %w", IPVSDevice, err)
	}
	var errs []error
	cleared := false
	if out, err := exec.Command("ipvsadm", "--clear").CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("kube-proxy's IPVS virtual servers remain: ipvsadm --clear: %w: %s", err, bytes.TrimSpace(out)))
	} else {
		cleared = true
	}
	sets, err := destroyIPSets()
	rep.IPSets = sets
	errs = append(errs, err)
	if err := netlink.LinkDel(l); err != nil {
		errs = append(errs, fmt.Errorf("delete %s: %w", IPVSDevice, err))
	} else {
		rep.Links = append(rep.Links, IPVSDevice)
	}
	return cleared, errors.Join(errs...)
}

// destroyIPSets destroys the KUBE-* ipsets (after the rules using them).
func destroyIPSets() ([]string, error) {
	out, err := exec.Command("ipset", "list", "-n").Output()
	if err != nil {
		return nil, fmt.Errorf("kube-proxy's ipsets remain: ipset list: %w", err)
	}
	var destroyed []string
	var errs []error
	for _, name := range strings.Fields(string(out)) {
		if !strings.HasPrefix(name, ChainPrefix) {
			continue
		}
		if o, err := exec.Command("ipset", "destroy", name).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("ipset destroy %s: %w: %s", name, err, bytes.TrimSpace(o)))
			continue
		}
		destroyed = append(destroyed, name)
	}
	slices.Sort(destroyed)
	return destroyed, errors.Join(errs...)
}
