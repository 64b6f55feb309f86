package iptables

import (
	"bytes"
	"fmt"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Runner is the iptables commands the proxier uses.
type Runner interface {
	// Restore runs iptables-restore --noflush with data (one or more
	// tables, each its own transaction).
	Restore(data []byte) error
	// Save returns iptables-save output for one table.
	Save(table string) ([]byte, error)
	// ListRules returns the rules of some chains of a table as iptables -S
	// prints them, without the leading "-A CHAIN".
	ListRules(table string, chains []string) (map[string][]string, error)
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

// Sync implements proxy.Backend. A full sync also puts the jumps from the
// built-in chains back on top, in the same transaction.
func (p *Proxier) Sync(ports map[cluster.Key][]*proxy.ServicePort, _ map[cluster.Key]bool, full bool) (proxy.SyncResult, error) {
	want := p.gen.Generate(ports)
	prev := p.applied
	var builtin map[string]map[string][]string // table -> built-in chain -> rules
	var err error
	if prev == nil {
		full = true
		prev, builtin, err = p.scan()
	} else if full {
		builtin, err = p.builtinRules()
	}
	if err != nil {
		return proxy.SyncResult{}, err
	}
	var extra map[string][]string
	if full {
		extra = make(map[string][]string)
		for _, t := range Tables {
			extra[t] = JumpFixes(t, builtin[t])
		}
	}
	data := RestoreData(prev, want, full, extra)
	p.applied = nil
	if len(data) > 0 {
		if err := p.runner.Restore(data); err != nil {
			return proxy.SyncResult{}, fmt.Errorf("iptables-restore: %w", err)
		}
	}
	p.applied = want
	res := proxy.SyncResult{Rules: make(map[string]int)}
	for _, t := range Tables {
		res.Rules[t] = want.Count(t)
	}
	return res, nil
}

// jumpChains returns the built-in chains holding the proxy's jumps in table.
func jumpChains(table string) []string {
	var out []string
	for _, j := range Jumps {
		if j.Table == table && !slices.Contains(out, j.Chain) {
			out = append(out, j.Chain)
		}
	}
	return out
}

func (p *Proxier) builtinRules() (map[string]map[string][]string, error) {
	out := make(map[string]map[string][]string)
	for _, t := range Tables {
		rules, err := p.runner.ListRules(t, jumpChains(t))
		if err != nil {
			return nil, fmt.Errorf("list built-in chains of %s: %w", t, err)
		}
		out[t] = rules
	}
	return out, nil
}

// scan reads the proxy's chains present in the kernel (without their rules:
// enough for RestoreData to delete those no longer wanted) and the built-in
// chains' rules.
func (p *Proxier) scan() (Ruleset, map[string]map[string][]string, error) {
	rs := make(Ruleset)
	builtin := make(map[string]map[string][]string)
	for _, t := range Tables {
		out, err := p.runner.Save(t)
		if err != nil {
			return nil, nil, fmt.Errorf("iptables-save -t %s: %w", t, err)
		}
		rs[t] = make(map[string][]string)
		for _, c := range ProxyChains(out) {
			rs[t][c] = nil
		}
		builtin[t] = ChainRules(out, jumpChains(t))
	}
	return rs, builtin, nil
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

// ChainRules returns the rules of the named chains in iptables-save (or -S)
// output, without the leading "-A CHAIN".
func ChainRules(save []byte, chains []string) map[string][]string {
	return ipt.ChainRules(save, chains)
}

// JumpFixes returns the restore lines that make the proxy's jumps the first
// rules of their built-in chains, in the order of Jumps, given the chains'
// current rules: nothing when they already are; otherwise every copy of
// them is deleted and they are inserted on top. A rule someone inserted
// above them (an ACCEPT for pod traffic in FORWARD, say) would let packets
// the proxy must reject through.
func JumpFixes(table string, current map[string][]string) []string {
	var out []string
	for _, chain := range jumpChains(table) {
		var want []Jump
		for _, j := range Jumps {
			if j.Table == table && j.Chain == chain {
				want = append(want, j)
			}
		}
		rules := current[chain]
		ours := 0
		for _, r := range rules {
			if isOurs(r) {
				ours++
			}
		}
		inPlace := ours == len(want) && len(rules) >= len(want)
		for i, j := range want {
			inPlace = inPlace && isJump(rules[i], j)
		}
		if inPlace {
			continue
		}
		for _, r := range rules {
			if isOurs(r) {
				out = append(out, "-D "+chain+" "+r)
			}
		}
		for i := len(want) - 1; i >= 0; i-- {
			out = append(out, "-I "+chain+" 1 "+strings.Join(quoteArgs(want[i].Args), " "))
		}
	}
	return out
}

func isOurs(rule string) bool {
	return strings.Contains(rule, JumpComment)
}

// isJump reports whether a listed rule is the jump j.
func isJump(rule string, j Jump) bool {
	return isOurs(rule) && strings.HasSuffix(rule, "-j "+j.Args[len(j.Args)-1])
}

func quoteArgs(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		if strings.ContainsAny(a, " \t") {
			a = `"` + a + `"`
		}
		out[i] = a
	}
	return out
}

// RestoreData returns the iptables-restore --noflush input that turns prev
// into want: every chain of want when full, else only chains whose rules
// differ; chains of prev missing from want are flushed and deleted; the
// lines of extra (per table) come after the rules. It is empty when nothing
// changes.
func RestoreData(prev, want Ruleset, full bool, extra map[string][]string) []byte {
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
		if len(write) == 0 && len(del) == 0 && len(extra[t]) == 0 {
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
		for _, l := range extra[t] {
			b.WriteString(l + "\n")
		}
		for _, n := range del {
			b.WriteString("-X " + n + "\n")
		}
		b.WriteString("COMMIT\n")
	}
	return b.Bytes()
}

// Cleanup removes the proxy's jumps and chains, one transaction per table.
func Cleanup(r Runner) error {
	var data []byte
	for _, t := range Tables {
		out, err := r.Save(t)
		if err != nil {
			return fmt.Errorf("iptables-save -t %s: %w", t, err)
		}
		prev := Ruleset{t: make(map[string][]string)}
		for _, c := range ProxyChains(out) {
			prev[t][c] = nil
		}
		var unjump []string
		for chain, rules := range ChainRules(out, jumpChains(t)) {
			for _, rule := range rules {
				if isOurs(rule) {
					unjump = append(unjump, "-D "+chain+" "+rule)
				}
			}
		}
		data = append(data, RestoreData(prev, Ruleset{}, false, map[string][]string{t: unjump})...)
	}
	if len(data) > 0 {
		if err := r.Restore(data); err != nil {
			return fmt.Errorf("iptables-restore: %w", err)
		}
	}
	return nil
}
