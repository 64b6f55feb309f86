package hostnet

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

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
	ipt := NewFakeIPTables()
	changed, err := EnsureChains(ipt, rules)
	if err != nil || !changed {
		t.Fatalf("first ensure: changed %v, err %v", changed, err)
	}
	if got := ipt.Dump(); got != wantChains {
		t.Fatalf("chains:\n%s\nwant:\n%s", got, wantChains)
	}
	writes := ipt.Writes
	if changed, err := EnsureChains(ipt, rules); err != nil || changed || ipt.Writes != writes {
		t.Fatalf("second ensure wrote (changed %v, err %v)", changed, err)
	}

	// Someone deletes the RETURN rule, or reorders, or drops the jump: the
	// next ensure restores exactly the wanted state.
	breaks := map[string]func(){
		"rule deleted":  func() { ipt.Chains["nat/PODNET-POSTROUTING"] = ipt.Chains["nat/PODNET-POSTROUTING"][1:] },
		"rules swapped": func() { c := ipt.Chains["nat/PODNET-POSTROUTING"]; c[0], c[1] = c[1], c[0] },
		"extra rule":    func() { ipt.Chains["filter/PODNET-FORWARD"] = append(ipt.Chains["filter/PODNET-FORWARD"], "-j DROP") },
		"jump deleted":  func() { ipt.Chains["filter/FORWARD"] = ipt.Chains["filter/FORWARD"][1:] },
	}
	for name, br := range breaks {
		br()
		if ipt.Dump() == wantChains {
			t.Fatalf("%s: break did nothing", name)
		}
		if changed, err := EnsureChains(ipt, rules); err != nil || !changed {
			t.Fatalf("%s: changed %v, err %v", name, changed, err)
		}
		if got := ipt.Dump(); got != wantChains {
			t.Errorf("%s: chains:\n%s", name, got)
		}
	}

	noMasq := Rules{ClusterCIDR: rules.ClusterCIDR}
	if _, err := EnsureChains(ipt, noMasq); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(ipt.Dump(), "MASQUERADE") {
		t.Error("--masquerade=false still masquerades")
	}

	if err := RemoveChains(ipt); err != nil {
		t.Fatal(err)
	}
	if got, want := ipt.Dump(), "filter/FORWARD\n  -j DROP\nnat/POSTROUTING\n  -j SOMEONE-ELSE\n"; got != want {
		t.Errorf("after remove:\n%s", got)
	}
	if err := RemoveChains(ipt); err != nil {
		t.Errorf("second remove: %v", err)
	}
}

// fakeSysctl is /proc/sys; readOnly makes writes fail as they do in an
// unprivileged container (EROFS).
type fakeSysctl struct {
	vals      map[string]string
	readOnly  bool
	sets      int
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
	f.sets++
	if f.readOnly {
		return &os.PathError{Op: "open", Path: "/proc/sys/" + name, Err: syscall.EROFS}
	}
	f.vals[name] = v
	return nil
}

var sysctlForward, sysctlBridgeNF = Sysctls(ipfamily.IPv4)

// TestEnsureSysctlsPerFamily: a dual-stack node gets IPv6 forwarding and
// br_netfilter's IPv6 hook beside IPv4's; an IPv6-only node only IPv6's;
// a read-only IPv6 hook left off is named.
func TestEnsureSysctlsPerFamily(t *testing.T) {
	fwd6, nf6 := Sysctls(ipfamily.IPv6)
	s := &fakeSysctl{vals: map[string]string{sysctlForward: "0", sysctlBridgeNF: "0", fwd6: "0", nf6: "0"}}
	if err := EnsureSysctls(s, ExecModprobe, ipfamily.IPv4, ipfamily.IPv6); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{sysctlForward, sysctlBridgeNF, "net/ipv6/conf/all/forwarding", "net/bridge/bridge-nf-call-ip6tables"} {
		if s.vals[k] != "1" {
			t.Errorf("dual-stack: %s = %q, want 1", k, s.vals[k])
		}
	}
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "0", sysctlBridgeNF: "0", fwd6: "0", nf6: "0"}}
	if err := EnsureSysctls(s, ExecModprobe, ipfamily.IPv6); err != nil || s.vals[fwd6] != "1" || s.vals[nf6] != "1" || s.vals[sysctlForward] != "0" {
		t.Errorf("IPv6 only: err %v, sysctls %v; want IPv6's set and IPv4's left alone", err, s.vals)
	}
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "1", sysctlBridgeNF: "1", fwd6: "1", nf6: "0"}, readOnly: true}
	if err := EnsureSysctls(s, ExecModprobe, ipfamily.IPv4, ipfamily.IPv6); !errors.Is(err, ErrSysctlReadOnly) || !strings.Contains(err.Error(), "bridge-nf-call-ip6tables") {
		t.Errorf("read-only IPv6 hook off: %v, want ErrSysctlReadOnly naming bridge-nf-call-ip6tables", err)
	}
}

func TestMasqueradeIPv6(t *testing.T) {
	ipt := NewFakeIPTables()
	if _, err := EnsureChains(ipt, Rules{ClusterCIDR: netip.MustParsePrefix("fd00:10:244::/56"), Masquerade: true}); err != nil {
		t.Fatal(err)
	}
	want := "-s fd00:10:244::/56 ! -d ff00::/8 -m comment --comment podnet: pods to outside the cluster -j MASQUERADE --random-fully"
	if got := ipt.Dump(); !strings.Contains(got, want) {
		t.Errorf("chains:\n%s\nwant the rule %q", got, want)
	}
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

	// Read-only /proc/sys with the values already right: only read.
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "1", sysctlBridgeNF: "1"}, readOnly: true}
	if err := EnsureSysctls(s, ExecModprobe); err != nil || s.sets != 0 {
		t.Errorf("read-only and already set: err %v after %d writes, want nil after none", err, s.sets)
	}
	// Read-only and wrong: reported, naming the sysctl and the fix.
	s = &fakeSysctl{vals: map[string]string{sysctlForward: "0", sysctlBridgeNF: "1"}, readOnly: true}
	err = EnsureSysctls(s, ExecModprobe)
	if !errors.Is(err, ErrSysctlReadOnly) || !strings.Contains(err.Error(), "net/ipv4/ip_forward is \"0\"") || !strings.Contains(err.Error(), "proxyd init") {
		t.Errorf("err = %v, want ErrSysctlReadOnly naming ip_forward and proxyd init", err)
	}
}

// The Service proxy's jumps at the head of FORWARD reject traffic to
// Services without endpoints; a re-inserted podnet jump must go behind them,
// not above, or pod traffic to such a Service would be accepted instead.
func TestJumpStaysBehindServiceProxy(t *testing.T) {
	ipt := NewFakeIPTables()
	r := rules
	r.ServiceHooks = []Hook{
		{"filter", "FORWARD", "PODSVC-FILTER"}, {"filter", "FORWARD", "PODSVC-FORWARD"},
		{"nat", "PREROUTING", "PODSVC-SERVICES"},
	}
	ipt.Chains["filter/FORWARD"] = []string{
		"-m comment --comment svc -j PODSVC-FILTER",
		"-m comment --comment svc -j PODSVC-FORWARD",
		"-j SOMEONE-ELSE",
	}
	if _, err := EnsureChains(ipt, r); err != nil {
		t.Fatal(err)
	}
	got := ipt.Chains["filter/FORWARD"]
	want := []string{
		"-m comment --comment svc -j PODSVC-FILTER",
		"-m comment --comment svc -j PODSVC-FORWARD",
		"-m comment --comment podnet -j PODNET-FORWARD",
		"-j SOMEONE-ELSE",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("FORWARD:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
