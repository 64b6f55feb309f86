// Package iptablestest has a fake iptables that fails like the kernel and a
// packet tracer that walks its rules.
package iptablestest

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

var builtins = map[string][]string{
	"nat":    {"PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"},
	"filter": {"INPUT", "FORWARD", "OUTPUT"},
}

// targets are the non-chain targets the fake accepts, by table ("" any).
var targets = map[string]string{
	"ACCEPT": "", "RETURN": "", "MARK": "", "LOG": "",
	"DNAT": "nat", "SNAT": "nat", "MASQUERADE": "nat",
	"DROP": "filter", "REJECT": "filter",
}

// Fake is an in-memory iptables. Restore is atomic per table, like the
// kernel: a transaction that appends to a missing chain, jumps to a chain
// that does not exist, deletes a chain still referenced or not empty, uses a
// target the table does not allow or DNATs to a port without a protocol
// fails and changes nothing.
type Fake struct {
	mu     sync.Mutex
	tables map[string]*table
	// Restores counts successful Restore calls; Last holds the last input.
	Restores int
	Last     []byte
	// FailNext makes the next Restore fail.
	FailNext bool
}

type table struct {
	order  []string
	chains map[string][]string
}

// New returns an empty Fake with the built-in chains.
func New() *Fake {
	f := &Fake{tables: make(map[string]*table)}
	for t, chains := range builtins {
		tb := &table{chains: make(map[string][]string)}
		for _, c := range chains {
			tb.order = append(tb.order, c)
			tb.chains[c] = nil
		}
		f.tables[t] = tb
	}
	return f
}

func (t *table) clone() *table {
	n := &table{order: slices.Clone(t.order), chains: make(map[string][]string, len(t.chains))}
	for k, v := range t.chains {
		n.chains[k] = slices.Clone(v)
	}
	return n
}

func isBuiltin(table, chain string) bool { return slices.Contains(builtins[table], chain) }

// Restore implements iptables.Runner (--noflush semantics).
func (f *Fake) Restore(data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Last = data
	if f.FailNext {
		f.FailNext = false
		return errors.New("fake iptables-restore: injected failure")
	}
	var name string
	var cur *table
	for i, line := range strings.Split(string(data), "\n") {
		fail := func(format string, a ...any) error {
			return fmt.Errorf("line %d %q: %s", i+1, line, fmt.Sprintf(format, a...))
		}
		line = strings.TrimSpace(line)
		switch {
		case line == "" || strings.HasPrefix(line, "#"):
		case strings.HasPrefix(line, "*"):
			name = line[1:]
			t, ok := f.tables[name]
			if !ok {
				return fail("no such table")
			}
			cur = t.clone()
		case cur == nil:
			return fail("outside a table")
		case line == "COMMIT":
			if err := validate(name, cur); err != nil {
				return fail("%v", err)
			}
			f.tables[name] = cur
			cur = nil
		case strings.HasPrefix(line, ":"):
			chain := strings.Fields(line[1:])[0]
			if isBuiltin(name, chain) {
				continue
			}
			if _, ok := cur.chains[chain]; !ok {
				cur.order = append(cur.order, chain)
			}
			cur.chains[chain] = nil
		default:
			if err := cur.command(name, strings.Fields(line)); err != nil {
				return fail("%v", err)
			}
		}
	}
	if cur != nil {
		return errors.New("missing COMMIT")
	}
	f.Restores++
	return nil
}

// command applies one rule command (-A, -I, -D, -F, -X) of a restore to
// table t, named name, refusing what iptables-restore refuses.
func (t *table) command(name string, args []string) error {
	if len(args) < 2 {
		return errors.New("bad line")
	}
	chain := args[1]
	if _, ok := t.chains[chain]; !ok {
		return fmt.Errorf("chain %s does not exist", chain)
	}
	switch args[0] {
	case "-A":
		if err := checkRule(name, args[2:]); err != nil {
			return err
		}
		t.chains[chain] = append(t.chains[chain], strings.Join(args[2:], " "))
	case "-I":
		pos, rule := 1, args[2:]
		if len(rule) > 0 {
			if n, err := strconv.Atoi(rule[0]); err == nil {
				pos, rule = n, rule[1:]
			}
		}
		if pos < 1 || pos > len(t.chains[chain])+1 {
			return errors.New("index of insertion too big")
		}
		if err := checkRule(name, rule); err != nil {
			return err
		}
		t.chains[chain] = slices.Insert(t.chains[chain], pos-1, strings.Join(rule, " "))
	case "-D":
		k := slices.Index(t.chains[chain], strings.Join(args[2:], " "))
		if k < 0 {
			return errors.New("rule does not exist")
		}
		t.chains[chain] = slices.Delete(t.chains[chain], k, k+1)
	case "-F":
		t.chains[chain] = nil
	case "-X":
		if isBuiltin(name, chain) {
			return errors.New("cannot delete built-in chain")
		}
		if len(t.chains[chain]) > 0 {
			return fmt.Errorf("chain %s is not empty", chain)
		}
		delete(t.chains, chain)
		t.order = slices.DeleteFunc(t.order, func(c string) bool { return c == chain })
	default:
		return errors.New("unsupported command")
	}
	return nil
}

func checkRule(table string, args []string) error {
	tgt := target(args)
	if t, ok := targets[tgt]; ok && t != "" && t != table {
		return fmt.Errorf("target %s not allowed in table %s", tgt, table)
	}
	if tgt == "DNAT" {
		to := value(args, "--to-destination")
		if strings.Contains(to, ":") && !slices.Contains(args, "-p") {
			return errors.New("DNAT to a port needs a protocol (-p)")
		}
	}
	return nil
}

// validate checks what the kernel checks at commit: every jump leads to an
// existing chain.
func validate(name string, t *table) error {
	for chain, rules := range t.chains {
		for _, r := range rules {
			args := strings.Fields(r)
			tgt := target(args)
			if tgt == "" {
				continue
			}
			if _, ok := targets[tgt]; ok {
				continue
			}
			if _, ok := t.chains[tgt]; !ok || isBuiltin(name, tgt) {
				return fmt.Errorf("chain %s: jump to missing chain %s", chain, tgt)
			}
		}
	}
	return nil
}

func target(args []string) string {
	for i, a := range args {
		if (a == "-j" || a == "-g") && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

func value(args []string, opt string) string {
	for i, a := range args {
		if a == opt && i+1 < len(args) {
			return args[i+1]
		}
	}
	return ""
}

// Save implements iptables.Runner.
func (f *Fake) Save(tableName string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tables[tableName]
	if !ok {
		return nil, fmt.Errorf("no table %s", tableName)
	}
	// Built-in chains first, then user chains sorted, as iptables-save does.
	order := slices.Clone(builtins[tableName])
	var user []string
	for c := range t.chains {
		if !isBuiltin(tableName, c) {
			user = append(user, c)
		}
	}
	slices.Sort(user)
	order = append(order, user...)
	var b strings.Builder
	b.WriteString("*" + tableName + "\n")
	for _, c := range order {
		policy := "-"
		if isBuiltin(tableName, c) {
			policy = "ACCEPT"
		}
		fmt.Fprintf(&b, ":%s %s [0:0]\n", c, policy)
	}
	for _, c := range order {
		for _, r := range t.chains[c] {
			fmt.Fprintf(&b, "-A %s %s\n", c, r)
		}
	}
	b.WriteString("COMMIT\n")
	return []byte(b.String()), nil
}

// ListRules implements iptables.Runner.
func (f *Fake) ListRules(tableName string, chains []string) (map[string][]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make(map[string][]string)
	for _, c := range chains {
		rules, ok := f.tables[tableName].chains[c]
		if !ok {
			return nil, fmt.Errorf("no chain %s", c)
		}
		out[c] = slices.Clone(rules)
	}
	return out, nil
}

// InsertRule inserts a rule, as another program might.
func (f *Fake) InsertRule(tableName, chain string, pos int, rule string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t := f.tables[tableName]
	t.chains[chain] = slices.Insert(t.chains[chain], pos-1, rule)
}

// DeleteChainRules empties a chain behind the proxy's back, as another
// program might.
func (f *Fake) DeleteChainRules(tableName, chain string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tables[tableName].chains[chain] = nil
}

// Chains returns the chain names of a table, sorted.
func (f *Fake) Chains(tableName string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for c := range f.tables[tableName].chains {
		out = append(out, c)
	}
	slices.Sort(out)
	return out
}

// Rules returns a copy of one chain's rules.
func (f *Fake) Rules(tableName, chain string) []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.tables[tableName].chains[chain])
}
