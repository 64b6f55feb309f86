package hostnet

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// FakeIPTables holds chains as rule strings and, like iptables, refuses a
// jump to a podnet chain that does not exist, deleting a chain that is not
// empty or still referenced, and deleting a rule that is not there. It
// starts with a foreign rule in POSTROUTING and a DROP in FORWARD, so tests
// see podnet's jumps go first. Not safe for concurrent use.
type FakeIPTables struct {
	Chains map[string][]string // "table/chain" -> rules
	Writes int                 // successful changes
}

// NewFakeIPTables returns a FakeIPTables with the built-in chains.
func NewFakeIPTables() *FakeIPTables {
	return &FakeIPTables{Chains: map[string][]string{
		"nat/POSTROUTING": {"-j SOMEONE-ELSE"},
		"filter/FORWARD":  {"-j DROP"},
	}}
}

func (f *FakeIPTables) ChainExists(table, chain string) (bool, error) {
	_, ok := f.Chains[table+"/"+chain]
	return ok, nil
}
func (f *FakeIPTables) NewChain(table, chain string) error {
	if _, ok := f.Chains[table+"/"+chain]; ok {
		return fmt.Errorf("chain %s already exists", chain)
	}
	f.Chains[table+"/"+chain] = nil
	f.Writes++
	return nil
}
func (f *FakeIPTables) ClearChain(table, chain string) error {
	f.Chains[table+"/"+chain] = nil
	f.Writes++
	return nil
}
func (f *FakeIPTables) DeleteChain(table, chain string) error {
	k := table + "/" + chain
	if len(f.Chains[k]) > 0 {
		return fmt.Errorf("chain %s not empty", chain)
	}
	for _, rules := range f.Chains {
		for _, r := range rules {
			if strings.HasSuffix(r, "-j "+chain) {
				return fmt.Errorf("chain %s still referenced", chain)
			}
		}
	}
	delete(f.Chains, k)
	f.Writes++
	return nil
}
func (f *FakeIPTables) check(table, chain string, rule []string) (string, error) {
	k := table + "/" + chain
	if _, ok := f.Chains[k]; !ok {
		return "", fmt.Errorf("no chain %s", k)
	}
	r := strings.Join(rule, " ")
	if t := target(rule); t != "" {
		name := strings.TrimPrefix(t, "-j ")
		if strings.HasPrefix(name, "PODNET-") {
			if _, ok := f.Chains[table+"/"+name]; !ok {
				return "", fmt.Errorf("jump to missing chain %s", name)
			}
		}
	}
	return r, nil
}
func (f *FakeIPTables) Exists(table, chain string, rule ...string) (bool, error) {
	r, err := f.check(table, chain, rule)
	if err != nil {
		return false, err
	}
	return slices.Contains(f.Chains[table+"/"+chain], r), nil
}
func (f *FakeIPTables) Insert(table, chain string, pos int, rule ...string) error {
	r, err := f.check(table, chain, rule)
	if err != nil {
		return err
	}
	k := table + "/" + chain
	f.Chains[k] = slices.Insert(f.Chains[k], pos-1, r)
	f.Writes++
	return nil
}
func (f *FakeIPTables) Append(table, chain string, rule ...string) error {
	r, err := f.check(table, chain, rule)
	if err != nil {
		return err
	}
	k := table + "/" + chain
	f.Chains[k] = append(f.Chains[k], r)
	f.Writes++
	return nil
}
func (f *FakeIPTables) Delete(table, chain string, rule ...string) error {
	k := table + "/" + chain
	r := strings.Join(rule, " ")
	i := slices.Index(f.Chains[k], r)
	if i < 0 {
		return errors.New("bad rule (does a matching rule exist in that chain?)")
	}
	f.Chains[k] = slices.Delete(f.Chains[k], i, i+1)
	f.Writes++
	return nil
}
func (f *FakeIPTables) List(table, chain string) ([]string, error) {
	k := table + "/" + chain
	out := []string{"-N " + chain}
	for _, r := range f.Chains[k] {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

// Dump renders every chain and its rules, sorted by table/chain.
func (f *FakeIPTables) Dump() string {
	var keys []string
	for k := range f.Chains {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s\n", k)
		for _, r := range f.Chains[k] {
			fmt.Fprintf(&b, "  %s\n", r)
		}
	}
	return b.String()
}
