package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"testing"
)

// fakeIPT holds chains as rule strings and, like iptables, refuses a jump
// to a chain that does not exist and deleting what is not there.
type fakeIPT struct {
	chains map[string][]string // "table/chain" -> rules
	writes int
}

func newFakeIPT() *fakeIPT {
	return &fakeIPT{chains: map[string][]string{
		"nat/POSTROUTING": {"-j SOMEONE-ELSE"},
		"filter/FORWARD":  {"-j DROP"},
	}}
}

func (f *fakeIPT) ChainExists(table, chain string) (bool, error) {
	_, ok := f.chains[table+"/"+chain]
	return ok, nil
}
func (f *fakeIPT) NewChain(table, chain string) error {
	if _, ok := f.chains[table+"/"+chain]; ok {
		return fmt.Errorf("chain %s already exists", chain)
	}
	f.chains[table+"/"+chain] = nil
	f.writes++
	return nil
}
func (f *fakeIPT) ClearChain(table, chain string) error {
	f.chains[table+"/"+chain] = nil
	f.writes++
	return nil
}
func (f *fakeIPT) DeleteChain(table, chain string) error {
	k := table + "/" + chain
	if len(f.chains[k]) > 0 {
		return fmt.Errorf("chain %s not empty", chain)
	}
	for _, rules := range f.chains {
		for _, r := range rules {
			if strings.HasSuffix(r, "-j "+chain) {
				return fmt.Errorf("chain %s still referenced", chain)
			}
		}
	}
	delete(f.chains, k)
	f.writes++
	return nil
}
func (f *fakeIPT) check(table, chain string, rule []string) (string, error) {
	k := table + "/" + chain
	if _, ok := f.chains[k]; !ok {
		return "", fmt.Errorf("no chain %s", k)
	}
	r := strings.Join(rule, " ")
	if t := target(rule); t != "" {
		name := strings.TrimPrefix(t, "-j ")
		if strings.HasPrefix(name, "PODNET-") {
			if _, ok := f.chains[table+"/"+name]; !ok {
				return "", fmt.Errorf("jump to missing chain %s", name)
			}
		}
	}
	return r, nil
}
func (f *fakeIPT) Exists(table, chain string, rule ...string) (bool, error) {
	r, err := f.check(table, chain, rule)
	if err != nil {
		return false, err
	}
	return slices.Contains(f.chains[table+"/"+chain], r), nil
}
func (f *fakeIPT) Insert(table, chain string, pos int, rule ...string) error {
	r, err := f.check(table, chain, rule)
	if err != nil {
		return err
	}
	k := table + "/" + chain
	f.chains[k] = slices.Insert(f.chains[k], pos-1, r)
	f.writes++
	return nil
}
func (f *fakeIPT) Append(table, chain string, rule ...string) error {
	r, err := f.check(table, chain, rule)
	if err != nil {
		return err
	}
	k := table + "/" + chain
	f.chains[k] = append(f.chains[k], r)
	f.writes++
	return nil
}
func (f *fakeIPT) Delete(table, chain string, rule ...string) error {
	k := table + "/" + chain
	r := strings.Join(rule, " ")
	i := slices.Index(f.chains[k], r)
	if i < 0 {
		return errors.New("bad rule (does a matching rule exist in that chain?)")
	}
	f.chains[k] = slices.Delete(f.chains[k], i, i+1)
	f.writes++
	return nil
}
func (f *fakeIPT) List(table, chain string) ([]string, error) {
	k := table + "/" + chain
	out := []string{"-N " + chain}
	for _, r := range f.chains[k] {
		out = append(out, "-A "+chain+" "+r)
	}
	return out, nil
}

func (f *fakeIPT) dump() string {
	var keys []string
	for k := range f.chains {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s\n", k)
		for _, r := range f.chains[k] {
			fmt.Fprintf(&b, "  %s\n", r)
		}
	}
	return b.String()
}

var rules = Rules{ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"), Masquerade: true}

const wantChains = `filter/FORWARD
  -m comment --comment podnet -j PODNET-FORWARD
  -j DROP
filter/PODNET-FORWARD
  -s 10.244.0.0/16 -m comment --comment podnet: from pods -j ACCEPT
  -d 10.244.0.0/16 -m comment --comment podnet: to pods -j ACCEPT
nat/PODNET-POSTROUTING
  -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment podnet: pod to pod keeps its source -j RETURN
  -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment podnet: pods to outside the cluster -j MASQUERADE --random-fully
nat/POSTROUTING
  -m comment --comment podnet -j PODNET-POSTROUTING
  -j SOMEONE-ELSE
`

func TestEnsureChains(t *testing.T) {
	ipt := newFakeIPT()
	changed, err := EnsureChains(ipt, rules)
	if err != nil || !changed {
		t.Fatalf("first ensure: changed %v, err %v", changed, err)
	}
	if got := ipt.dump(); got != wantChains {
		t.Fatalf("chains:\n%s\nwant:\n%s", got, wantChains)
	}
	writes := ipt.writes
	if changed, err := EnsureChains(ipt, rules); err != nil || changed || ipt.writes != writes {
		t.Fatalf("second ensure wrote (changed %v, err %v)", changed, err)
	}

	// Someone deletes the RETURN rule, or reorders, or drops the jump: the
	// next ensure restores exactly the wanted state.
	breaks := map[string]func(){
		"rule deleted":  func() { ipt.chains["nat/PODNET-POSTROUTING"] = ipt.chains["nat/PODNET-POSTROUTING"][1:] },
		"rules swapped": func() { c := ipt.chains["nat/PODNET-POSTROUTING"]; c[0], c[1] = c[1], c[0] },
		"extra rule":    func() { ipt.chains["filter/PODNET-FORWARD"] = append(ipt.chains["filter/PODNET-FORWARD"], "-j DROP") },
		"jump deleted":  func() { ipt.chains["filter/FORWARD"] = ipt.chains["filter/FORWARD"][1:] },
	}
	for name, br := range breaks {
		br()
		if ipt.dump() == wantChains {
			t.Fatalf("%s: break did nothing", name)
		}
		if changed, err := EnsureChains(ipt, rules); err != nil || !changed {
			t.Fatalf("%s: changed %v, err %v", name, changed, err)
		}
		if got := ipt.dump(); got != wantChains {
			t.Errorf("%s: chains:\n%s", name, got)
		}
	}

	noMasq := Rules{ClusterCIDR: rules.ClusterCIDR}
	if _, err := EnsureChains(ipt, noMasq); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ipt.dump(), "MASQUERADE") {
		t.Error("--masquerade=false still masquerades")
	}

	if err := RemoveChains(ipt); err != nil {
		t.Fatal(err)
	}
	if got, want := ipt.dump(), "filter/FORWARD\n  -j DROP\nnat/POSTROUTING\n  -j SOMEONE-ELSE\n"; got != want {
		t.Errorf("after remove:\n%s", got)
	}
	if err := RemoveChains(ipt); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

type fakeSysctl struct {
	vals      map[string]string
	readOnly  bool
	modprobed []string
}

func (f *fakeSysctl) Get(name string) (string, error) {
	v, ok := f.vals[name]
	if !ok {
		return "", fmt.Errorf("open /proc/sys/%s: %w", name, os.ErrNotExist)
	}
	return v, nil
}
func (f *fakeSysctl) Set(name, v string) error {
	if _, ok := f.vals[name]; !ok {
		return os.ErrNotExist
	}
	if f.readOnly {
		return os.ErrPermission
	}
	f.vals[name] = v
	return nil
}

func TestEnsureSysctls(t *testing.T) {
	s := &fakeSysctl{vals: map[string]string{sysctlForward: "0", sysctlBridgeNF: "0"}}
	if err := EnsureSysctls(s, func(string) error { t.Error("modprobe called though loaded"); return nil }); err != nil {
		t.Fatal(err)
	}
	if s.vals[sysctlForward] != "1" || s.vals[sysctlBridgeNF] != "1" {
		t.Errorf("sysctls = %v", s.vals)
	}

	// Missing br_netfilter that modprobe loads.
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "1"}}
	err := EnsureSysctls(s, func(m string) error {
		s.modprobed = append(s.modprobed, m)
		s.vals[sysctlBridgeNF] = "0"
		return nil
	})
	if err != nil || !slices.Equal(s.modprobed, []string{"br_netfilter"}) || s.vals[sysctlBridgeNF] != "1" {
		t.Errorf("after modprobe: err %v, modprobed %v, vals %v", err, s.modprobed, s.vals)
	}

	// Missing and cannot be loaded: the error says what to do.
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "1"}}
	err = EnsureSysctls(s, func(string) error { return errors.New("modprobe: not found") })
	if !errors.Is(err, ErrBrNetfilter) || !strings.Contains(err.Error(), "modprobe br_netfilter") {
		t.Errorf("err = %v, want ErrBrNetfilter telling to modprobe", err)
	}

	// Read-only /proc/sys: reported, naming the sysctl.
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "0", sysctlBridgeNF: "1"}, readOnly: true}
	if err := EnsureSysctls(s, ExecModprobe); err == nil || !strings.Contains(err.Error(), "ip_forward") {
		t.Errorf("err = %v, want one naming ip_forward", err)
	}
}
