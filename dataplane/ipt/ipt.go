// Package ipt runs the iptables commands of one backend, nft or legacy, for
// every part of podnet that writes iptables rules (the node's own chains in
// hostnet, the Service proxy's chains), so they all write into the backend
// the node already uses and can never end up in different ones.
package ipt

import (
	"bytes"
	"fmt"
	"os/exec"
	"strings"
	"sync"

	goiptables "github.com/coreos/go-iptables/iptables"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// Backends of the iptables command.
const (
	BackendNFT    = "nft"
	BackendLegacy = "legacy"
)

// Backends lists both backends, nft first.
var Backends = []string{BackendNFT, BackendLegacy}

// Runner runs the iptables-<backend> commands, or ip6tables-<backend> for
// IPv6. The commands inherit the calling thread's network namespace.
type Runner struct {
	Backend string // BackendNFT or BackendLegacy
	// Family chooses iptables (IPv4, or zero) or ip6tables (IPv6).
	Family ipfamily.Family
}

// New returns the Runner for backend; "" detects the one the node uses.
func New(backend string) (Runner, error) {
	switch backend {
	case "":
		return Runner{Backend: Detect()}, nil
	case BackendNFT, BackendLegacy:
		return Runner{Backend: backend}, nil
	}
	return Runner{}, fmt.Errorf("iptables backend %q: want %q or %q", backend, BackendNFT, BackendLegacy)
}

// For returns the runner of the same backend for family f.
func (r Runner) For(f ipfamily.Family) Runner { return Runner{Backend: r.Backend, Family: f} }

func (r Runner) cmd(tool string) string { return command(r.Family) + "-" + r.Backend + tool }

// command is the family's iptables command.
func command(f ipfamily.Family) string {
	if f == ipfamily.IPv6 {
		return "ip6tables"
	}
	return "iptables"
}

func run(name string, stdin []byte, args ...string) ([]byte, error) {
	c := exec.Command(name, args...)
	if stdin != nil {
		c.Stdin = bytes.NewReader(stdin)
	}
	var out, stderr bytes.Buffer
	c.Stdout, c.Stderr = &out, &stderr
	if err := c.Run(); err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out.Bytes(), nil
}

// Restore runs iptables-restore --noflush with data (one or more tables,
// each its own transaction).
func (r Runner) Restore(data []byte) error {
	_, err := run(r.cmd("-restore"), data, "--noflush", "-w", "5")
	return err
}

// Command is the iptables command this runner runs: iptables-nft,
// ip6tables-legacy and the like.
func (r Runner) Command() string { return r.cmd("") }

// SaveAll returns iptables-save output for every table that exists;
// unlike Save, it creates none.
func (r Runner) SaveAll() ([]byte, error) {
	return run(r.cmd("-save"), nil)
}

// Save returns iptables-save output for one table.
func (r Runner) Save(table string) ([]byte, error) {
	return run(r.cmd("-save"), nil, "-t", table)
}

// ListRules returns the rules of some chains of a table as iptables -S
// prints them, without the leading "-A CHAIN". iptables-legacy reads the
// whole table for any command, so one iptables-save is cheaper than one -S
// per chain; with nft, -S reads just the chain.
func (r Runner) ListRules(table string, chains []string) (map[string][]string, error) {
	if r.Backend == BackendLegacy {
		out, err := r.Save(table)
		if err != nil {
			return nil, err
		}
		return ChainRules(out, chains), nil
	}
	rules := make(map[string][]string)
	for _, c := range chains {
		out, err := run(r.cmd(""), nil, "-w", "5", "-t", table, "-S", c)
		if err != nil {
			return nil, err
		}
		rules[c] = ChainRules(out, []string{c})[c]
	}
	return rules, nil
}

// Contains reports whether the backend's rules mention s (a chain prefix,
// say). iptables-save without -t lists only the tables that exist, so
// asking leaves a backend the node does not use untouched (naming a table
// would create it). A backend whose tools are missing contains nothing.
func (r Runner) Contains(s string) bool {
	out, err := exec.Command(r.cmd("-save")).Output()
	return err == nil && strings.Contains(string(out), s)
}

// Chains returns go-iptables bound to this backend's iptables command, for
// rule-at-a-time changes.
func (r Runner) Chains() (*goiptables.IPTables, error) {
	proto := goiptables.ProtocolIPv4
	if r.Family == ipfamily.IPv6 {
		proto = goiptables.ProtocolIPv6
	}
	return goiptables.New(goiptables.Path(r.cmd("")), goiptables.IPFamily(proto))
}

// Available reports whether the backend's commands are installed.
func (r Runner) Available() error {
	for _, tool := range []string{"", "-save", "-restore"} {
		if _, err := exec.LookPath(r.cmd(tool)); err != nil {
			return fmt.Errorf("%s is not installed: %w", r.cmd(tool), err)
		}
	}
	return nil
}

// NodeBackend is the backend the node uses, detected once per process
// (Detect): the node firewall and the Service proxy ask it and so write
// into the same one.
var NodeBackend = sync.OnceValue(Detect)

// Detect picks the iptables backend the node already uses, the way
// kube-proxy's iptables-wrapper does: the one holding more rules; on a tie
// the one the node's own iptables command uses, else nft. A backend whose
// tools are missing is not chosen.
func Detect() string {
	count := func(b string) int {
		out, err := exec.Command("iptables-" + b + "-save").Output()
		if err != nil {
			return -1
		}
		n := 0
		for _, l := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(l, "-") {
				n++
			}
		}
		return n
	}
	nft, legacy := count(BackendNFT), count(BackendLegacy)
	switch {
	case legacy > nft:
		return BackendLegacy
	case legacy == nft && legacy >= 0:
		if out, err := exec.Command("iptables", "--version").Output(); err == nil && strings.Contains(string(out), "legacy") {
			return BackendLegacy
		}
	}
	return BackendNFT
}

// ChainRules returns the rules of the named chains in iptables-save (or -S)
// output, without the leading "-A CHAIN".
func ChainRules(save []byte, chains []string) map[string][]string {
	out := make(map[string][]string, len(chains))
	for _, c := range chains {
		out[c] = []string{}
	}
	for line := range bytes.Lines(save) {
		rest, ok := bytes.CutPrefix(line, []byte("-A "))
		if !ok {
			continue
		}
		chain, rule, _ := strings.Cut(strings.TrimSpace(string(rest)), " ")
		if _, want := out[chain]; want {
			out[chain] = append(out[chain], rule)
		}
	}
	return out
}
