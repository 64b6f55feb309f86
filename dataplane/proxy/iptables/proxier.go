package iptables

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Runner is the iptables commands the proxier uses.
type Runner interface {
	// Restore runs iptables-restore --noflush with data (one or more
	// tables, each its own transaction).
	Restore(data []byte) error
	// Save returns iptables-save output for one table.
	Save(table string) ([]byte, error)
	// ListRules returns a chain's rules as iptables -S prints them, without
	// the leading "-A CHAIN".
	ListRules(table, chain string) ([]string, error)
	// InsertRule inserts a rule at a position (from 1).
	InsertRule(table, chain string, pos int, args ...string) error
	// DeleteRule deletes one copy of the rule; it fails if there is none.
	DeleteRule(table, chain string, args ...string) error
}

// Tables are the tables the proxy writes, in restore order.
var Tables = []string{"nat", "filter"}

// Proxier is the iptables proxy.Backend.
type Proxier struct {
	runner Runner
	gen    *Generator
	// applied is what the kernel held after the last successful sync; nil
	// when unknown (start, after a failure): the next sync is then full and
	// first looks for leftover chains to delete.
	applied Ruleset
}

// NewProxier returns a Proxier; it does nothing until Sync.
func NewProxier(cfg Config, runner Runner) *Proxier {
	return &Proxier{runner: runner, gen: NewGenerator(cfg)}
}

var _ proxy.Backend = (*Proxier)(nil)

// Sync implements proxy.Backend.
func (p *Proxier) Sync(ports map[cluster.Key][]*proxy.ServicePort, _ map[cluster.Key]bool, full bool) (proxy.SyncResult, error) {
	want := p.gen.Generate(ports)
	prev := p.applied
	if prev == nil {
		full = true
		existing, err := p.existingChains()
		if err != nil {
			return proxy.SyncResult{}, err
		}
		prev = existing
	}
	data := RestoreData(prev, want, full)
	p.applied = nil
	if len(data) > 0 {
		if err := p.runner.Restore(data); err != nil {
			return proxy.SyncResult{}, fmt.Errorf("iptables-restore: %w", err)
		}
	}
	if full {
		if err := ensureJumps(p.runner); err != nil {
			return proxy.SyncResult{}, err
		}
	}
	p.applied = want
	res := proxy.SyncResult{Rules: make(map[string]int)}
	for _, t := range Tables {
		res.Rules[t] = want.Count(t)
	}
	return res, nil
}

// ensureJumps makes the proxy's jumps the first rules of their built-in
// chains, in the order of Jumps: a rule someone inserted above them (an
// ACCEPT for pod traffic in FORWARD, say) would let packets the proxy must
// reject through. Jumps found elsewhere are moved.
func ensureJumps(r Runner) error {
	type chainKey struct{ table, chain string }
	var order []chainKey
	want := make(map[chainKey][]Jump)
	for _, j := range Jumps {
		k := chainKey{j.Table, j.Chain}
		if want[k] == nil {
			order = append(order, k)
		}
		want[k] = append(want[k], j)
	}
	for _, k := range order {
		rules, err := r.ListRules(k.table, k.chain)
		if err != nil {
			return fmt.Errorf("list %s %s: %w", k.table, k.chain, err)
		}
		jumps := want[k]
		// Inserted last means first: the wanted order is the reverse.
		slices.Reverse(jumps)
		inPlace := len(rules) >= len(jumps)
		for i, j := range jumps {
			inPlace = inPlace && isJump(rules[len(jumps)-1-i], j)
		}
		ours := 0
		for _, rule := range rules {
			if strings.Contains(rule, JumpComment) {
				ours++
			}
		}
		if inPlace && ours == len(jumps) {
			continue
		}
		for _, j := range jumps {
			for r.DeleteRule(j.Table, j.Chain, j.Args...) == nil {
			}
		}
		for _, j := range jumps {
			if err := r.InsertRule(j.Table, j.Chain, 1, j.Args...); err != nil {
				return fmt.Errorf("insert jump to %s into %s %s: %w", j.Args[len(j.Args)-1], j.Table, j.Chain, err)
			}
		}
	}
	return nil
}

// isJump reports whether an iptables -S rule is the jump j.
func isJump(rule string, j Jump) bool {
	return strings.Contains(rule, JumpComment) && strings.HasSuffix(rule, "-j "+j.Args[len(j.Args)-1])
}

// existingChains lists the proxy's chains present in the kernel, with no
// rules: enough for RestoreData to delete the ones no longer wanted.
func (p *Proxier) existingChains() (Ruleset, error) {
	rs := make(Ruleset)
	for _, t := range Tables {
		out, err := p.runner.Save(t)
		if err != nil {
			return nil, fmt.Errorf("iptables-save -t %s: %w", t, err)
		}
		rs[t] = make(map[string][]string)
		for _, c := range ProxyChains(out) {
			rs[t][c] = nil
		}
	}
	return rs, nil
}

// ProxyChains returns the proxy's chains declared in iptables-save output.
func ProxyChains(save []byte) []string {
	var out []string
	for line := range bytes.Lines(save) {
		if len(line) > 1 && line[0] == ':' && bytes.HasPrefix(line[1:], []byte(ChainPrefix)) {
			name, _, _ := strings.Cut(string(line[1:]), " ")
			out = append(out, strings.TrimSpace(name))
		}
	}
	return out
}

// RestoreData returns the iptables-restore --noflush input that turns prev
// into want: every chain of want when full, else only chains whose rules
// differ; chains of prev missing from want are flushed and deleted. It is
// empty when nothing changes.
func RestoreData(prev, want Ruleset, full bool) []byte {
	var b bytes.Buffer
	for _, t := range Tables {
		var write, del []string
		for name, rules := range want[t] {
			old, had := prev[t][name]
			if full || !had || !slices.Equal(old, rules) {
				write = append(write, name)
			}
		}
		for name := range prev[t] {
			if _, ok := want[t][name]; !ok {
				del = append(del, name)
			}
		}
		if len(write) == 0 && len(del) == 0 {
			continue
		}
		slices.Sort(write)
		slices.Sort(del)
		size := 64
		for _, n := range write {
			size += 2 * len(n)
			for _, r := range want[t][n] {
				size += len(n) + len(r) + 5
			}
		}
		b.Grow(size + 64*len(del))
		b.WriteString("*" + t + "\n")
		for _, names := range [][]string{write, del} {
			for _, n := range names {
				b.WriteString(":" + n + " - [0:0]\n")
			}
		}
		for _, n := range write {
			for _, r := range want[t][n] {
				b.WriteString("-A ")
				b.WriteString(n)
				b.WriteByte(' ')
				b.WriteString(r)
				b.WriteByte('\n')
			}
		}
		for _, n := range del {
			b.WriteString("-X " + n + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

// Cleanup removes the proxy's jumps and chains.
func Cleanup(r Runner) error {
	for _, j := range Jumps {
		for r.DeleteRule(j.Table, j.Chain, j.Args...) == nil {
		}
	}
	prev := make(Ruleset)
	for _, t := range Tables {
		out, err := r.Save(t)
		if err != nil {
			return fmt.Errorf("iptables-save -t %s: %w", t, err)
		}
		prev[t] = make(map[string][]string)
		for _, c := range ProxyChains(out) {
			prev[t][c] = nil
		}
	}
	if data := RestoreData(prev, Ruleset{}, false); len(data) > 0 {
		if err := r.Restore(data); err != nil {
			return fmt.Errorf("iptables-restore: %w", err)
		}
	}
	return nil
}
