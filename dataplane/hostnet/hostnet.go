// Package hostnet prepares the node's own network stack for pods: IP
// forwarding, bridged traffic through iptables (br_netfilter), masquerading
// of pod traffic that leaves the cluster, and FORWARD rules that keep pods
// reachable when the host's FORWARD policy is DROP.
//
// Rules live in podnet's own chains, reached by one jump each from the
// built-in chain; the chains' contents are rewritten only when they differ
// from what they should be, so a restart of proxyd does not disturb
// conntrack or open a window without masquerading.
package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Chain names. Every chain of this package starts with ChainPrefix.
const (
	ChainPrefix      = "PODNET-"
	ChainPostrouting = ChainPrefix + "POSTROUTING"
	ChainForward     = ChainPrefix + "FORWARD"
)

// ErrBrNetfilter says bridged traffic cannot be made to traverse iptables.
var ErrBrNetfilter = errors.New("br_netfilter is not loaded")

// ErrSysctlReadOnly says a sysctl has the wrong value and /proc/sys cannot
// be written here: the read-only /proc/sys of an unprivileged container.
var ErrSysctlReadOnly = errors.New("sysctl cannot be set: /proc/sys is read-only here")

// Sysctl reads and writes sysctls by their /proc/sys path ("net/ipv4/ip_forward").
type Sysctl interface {
	Get(name string) (string, error)
	Set(name, value string) error
}

// ProcSysctl is the real Sysctl over /proc/sys (per network namespace for
// net/*: the namespace of the calling thread).
type ProcSysctl struct{}

func (ProcSysctl) Get(name string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", name))
	return strings.TrimSpace(string(b)), err
}

func (ProcSysctl) Set(name, value string) error {
	return os.WriteFile(filepath.Join("/proc/sys", name), []byte(value), 0o644)
}

// Modprobe loads a kernel module.
type Modprobe func(module string) error

// ExecModprobe runs modprobe(8).
func ExecModprobe(module string) error {
	out, err := exec.Command("modprobe", module).CombinedOutput()
	if err != nil {
		return fmt.Errorf("modprobe %s: %w: %s", module, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Sysctls names the forwarding sysctl and br_netfilter's hook of family f:
// IPv4's ip_forward and bridge-nf-call-iptables, IPv6's
// conf/all/forwarding and bridge-nf-call-ip6tables.
func Sysctls(f ipfamily.Family) (forward, bridgeNF string) {
	if f == ipfamily.IPv6 {
		return "net/ipv6/conf/all/forwarding", "net/bridge/bridge-nf-call-ip6tables"
	}
	return "net/ipv4/ip_forward", "net/bridge/bridge-nf-call-iptables"
}

// EnsureSysctls turns on IP forwarding and bridged-traffic filtering for
// each family (IPv4 alone when none is given), loading br_netfilter if its
// sysctls are missing. A sysctl that already has its value is only read,
// so this works in a container whose /proc/sys is read-only once something
// privileged (proxyd init) has set them. The error says what an operator
// has to do when it cannot be fixed from here.
func EnsureSysctls(s Sysctl, modprobe Modprobe, families ...ipfamily.Family) error {
	if len(families) == 0 {
		families = []ipfamily.Family{ipfamily.IPv4}
	}
	for _, f := range families {
		forward, bridgeNF := Sysctls(f)
		if err := ensure(s, forward, "1"); err != nil {
			return err
		}
		if _, err := s.Get(bridgeNF); errors.Is(err, os.ErrNotExist) {
			merr := modprobe("br_netfilter")
			if _, err := s.Get(bridgeNF); err != nil {
				return fmt.Errorf("%w (/proc/sys/%s is missing; loading it failed: %v): run `modprobe br_netfilter` on the host and add br_netfilter to /etc/modules-load.d/",
					ErrBrNetfilter, bridgeNF, merr)
			}
		}
		if err := ensure(s, bridgeNF, "1"); err != nil {
			return err
		}
	}
	return nil
}

func ensure(s Sysctl, name, want string) error {
	got, err := s.Get(name)
	if err != nil {
		return fmt.Errorf("read sysctl %s: %w", name, err)
	}
	if got == want {
		return nil
	}
	if err := s.Set(name, want); errors.Is(err, syscall.EROFS) {
		return fmt.Errorf("%w: %s is %q, want %q: set it before proxyd starts (`proxyd init` in a privileged init container, as deploy/base/podnet.yaml does, or on the host)",
			ErrSysctlReadOnly, name, got, want)
	} else if err != nil {
		return fmt.Errorf("set sysctl %s=%s: %w", name, want, err)
	}
	if got, err := s.Get(name); err != nil || got != want {
		return fmt.Errorf("sysctl %s is %q after setting %q", name, got, want)
	}
	return nil
}

// IPTables is the part of go-iptables the chains need; *iptables.IPTables
// satisfies it.
type IPTables interface {
	ChainExists(table, chain string) (bool, error)
	NewChain(table, chain string) error
	ClearChain(table, chain string) error
	DeleteChain(table, chain string) error
	Exists(table, chain string, rulespec ...string) (bool, error)
	Insert(table, chain string, pos int, rulespec ...string) error
	Append(table, chain string, rulespec ...string) error
	Delete(table, chain string, rulespec ...string) error
	List(table, chain string) ([]string, error)
}

// NodeFirewall is the node's own filtering and NAT for pods: masquerade of
// pod traffic leaving the cluster and the FORWARD accepts that keep pods
// reachable under a DROP policy, placed behind the Service proxy's hooks
// (Rules.ServiceHooks): the proxy rejects traffic to Services without
// endpoints in FORWARD, and the accept of all pod traffic must not overtake
// it. IPTablesFirewall is the one in podnet's iptables chains; a mode that
// owns the whole node's packet path (nftables) brings its own.
type NodeFirewall interface {
	// Ensure makes the node hold r, changing only what differs; it
	// reports whether anything changed.
	Ensure(r Rules) (bool, error)
	// Remove takes everything of the firewall's away; what is not there
	// is no error.
	Remove() error
}

// IPTablesFirewall is the NodeFirewall in podnet's iptables chains.
type IPTablesFirewall struct{ IPT IPTables }

func (f IPTablesFirewall) Ensure(r Rules) (bool, error) { return EnsureChains(f.IPT, r) }
func (f IPTablesFirewall) Remove() error                { return RemoveChains(f.IPT) }

// Hook is a rule of the Service proxy in a built-in chain: a jump from
// Chain of Table to its own chain Target. The node firewall's jumps stay
// behind the hooks of their chain.
type Hook struct {
	Table, Chain, Target string
}

// Rules is what podnet's chains hold.
type Rules struct {
	ClusterCIDR netip.Prefix
	// Masquerade pod traffic leaving the cluster CIDR.
	Masquerade bool
	// ServiceHooks are the Service proxy's hooks the firewall's own jumps
	// go behind.
	ServiceHooks []Hook
}

// Chain is one of podnet's chains: its rules and where it is jumped to from.
type Chain struct {
	Table, Name, From string
	Rules             [][]string
}

const comment = "podnet"

// Chains returns the desired chains, in order. Pure.
func (r Rules) Chains() []Chain {
	cidr := r.ClusterCIDR.String()
	post := Chain{Table: "nat", Name: ChainPostrouting, From: "POSTROUTING"}
	post.Rules = append(post.Rules,
		// Pod to pod keeps its source, on this node or across nodes.
		[]string{"-s", cidr, "-d", cidr, "-m", "comment", "--comment", "podnet: pod to pod keeps its source", "-j", "RETURN"})
	if r.Masquerade {
		post.Rules = append(post.Rules,
			[]string{"-s", cidr, "!", "-d", multicast(ipfamily.OfPrefix(r.ClusterCIDR)), "-m", "comment", "--comment", "podnet: pods to outside the cluster", "-j", "MASQUERADE", "--random-fully"})
	}
	fwd := Chain{Table: "filter", Name: ChainForward, From: "FORWARD", Rules: [][]string{
		{"-s", cidr, "-m", "comment", "--comment", "podnet: from pods", "-j", "ACCEPT"},
		{"-d", cidr, "-m", "comment", "--comment", "podnet: to pods", "-j", "ACCEPT"},
	}}
	return []Chain{post, fwd}
}

// multicast is family f's multicast range, which is never masqueraded.
func multicast(f ipfamily.Family) string {
	if f == ipfamily.IPv6 {
		return "ff00::/8"
	}
	return "224.0.0.0/4"
}

func jump(c Chain) []string {
	return []string{"-m", "comment", "--comment", comment, "-j", c.Name}
}

// EnsureChains makes the chains and jumps hold r, rewriting a chain only
// when its rules differ. It reports whether anything changed.
func EnsureChains(ipt IPTables, r Rules) (bool, error) {
	changed := false
	for _, c := range r.Chains() {
		ok, err := ipt.ChainExists(c.Table, c.Name)
		if err != nil {
			return changed, fmt.Errorf("check chain %s/%s: %w", c.Table, c.Name, err)
		}
		if !ok {
			if err := ipt.NewChain(c.Table, c.Name); err != nil {
				return changed, fmt.Errorf("create chain %s/%s: %w", c.Table, c.Name, err)
			}
			changed = true
		}
		same, err := holds(ipt, c)
		if err != nil {
			return changed, err
		}
		if !same {
			if err := ipt.ClearChain(c.Table, c.Name); err != nil {
				return changed, fmt.Errorf("flush chain %s/%s: %w", c.Table, c.Name, err)
			}
			for _, rule := range c.Rules {
				if err := ipt.Append(c.Table, c.Name, rule...); err != nil {
					return true, fmt.Errorf("append to %s/%s: %w", c.Table, c.Name, err)
				}
			}
			changed = true
		}
		ok, err = ipt.Exists(c.Table, c.From, jump(c)...)
		if err != nil {
			return changed, fmt.Errorf("check jump %s/%s -> %s: %w", c.Table, c.From, c.Name, err)
		}
		if !ok {
			// First but for the Service proxy's hooks, so a host FORWARD
			// policy or rule that drops does not cut pods off.
			pos, err := insertPosition(ipt, c.Table, c.From, r.hookTargets(c.Table, c.From))
			if err != nil {
				return changed, err
			}
			if err := ipt.Insert(c.Table, c.From, pos, jump(c)...); err != nil {
				return changed, fmt.Errorf("insert jump %s/%s -> %s: %w", c.Table, c.From, c.Name, err)
			}
			changed = true
		}
	}
	return changed, nil
}

// hookTargets are the targets of the Service proxy's hooks in chain of
// table.
func (r Rules) hookTargets(table, chain string) map[string]bool {
	out := make(map[string]bool)
	for _, h := range r.ServiceHooks {
		if h.Table == table && h.Chain == chain {
			out[h.Target] = true
		}
	}
	return out
}

// insertPosition is 1 plus the number of rules at the head of chain that
// jump to one of hooks.
func insertPosition(ipt IPTables, table, chain string, hooks map[string]bool) (int, error) {
	if len(hooks) == 0 {
		return 1, nil
	}
	rules, err := ipt.List(table, chain)
	if err != nil {
		return 0, fmt.Errorf("list %s/%s: %w", table, chain, err)
	}
	pos := 1
	for _, r := range rules {
		if !strings.HasPrefix(r, "-A ") {
			continue // the -P or -N line
		}
		if !hooks[strings.TrimPrefix(target(strings.Fields(r)), "-j ")] {
			break
		}
		pos++
	}
	return pos, nil
}

// holds reports whether the chain holds exactly c's rules in order: every
// rule exists (iptables -C does the normalising) and the count matches, and
// the rules appear in order in the listing.
func holds(ipt IPTables, c Chain) (bool, error) {
	list, err := ipt.List(c.Table, c.Name)
	if err != nil {
		return false, fmt.Errorf("list chain %s/%s: %w", c.Table, c.Name, err)
	}
	var rules []string
	for _, l := range list {
		if strings.HasPrefix(l, "-A ") {
			rules = append(rules, l)
		}
	}
	if len(rules) != len(c.Rules) {
		return false, nil
	}
	for i, want := range c.Rules {
		ok, err := ipt.Exists(c.Table, c.Name, want...)
		if err != nil {
			return false, fmt.Errorf("check rule in %s/%s: %w", c.Table, c.Name, err)
		}
		// Order matters (RETURN before MASQUERADE): the target of the
		// i-th listed rule must be the i-th wanted target.
		if !ok || !strings.Contains(rules[i], target(want)) {
			return false, nil
		}
	}
	return true, nil
}

func target(rule []string) string {
	for i, a := range rule {
		if a == "-j" && i+1 < len(rule) {
			return "-j " + rule[i+1]
		}
	}
	return ""
}

// RemoveChains deletes the jumps and chains. Missing ones are no error.
func RemoveChains(ipt IPTables) error {
	var errs []error
	for _, c := range (Rules{ClusterCIDR: netip.MustParsePrefix("0.0.0.0/0")}).Chains() {
		ok, err := ipt.ChainExists(c.Table, c.Name)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if !ok {
			continue
		}
		for {
			ok, err := ipt.Exists(c.Table, c.From, jump(c)...)
			if err != nil || !ok {
				break
			}
			if err := ipt.Delete(c.Table, c.From, jump(c)...); err != nil {
				errs = append(errs, err)
				break
			}
		}
		if err := ipt.ClearChain(c.Table, c.Name); err != nil {
			errs = append(errs, err)
		}
		if err := ipt.DeleteChain(c.Table, c.Name); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
