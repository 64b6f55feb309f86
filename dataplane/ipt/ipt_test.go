package ipt

import (
	"strings"
	"testing"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

func TestNewNamesBadBackend(t *testing.T) {
	if _, err := New("xtables"); err == nil || !strings.Contains(err.Error(), `"xtables"`) {
		t.Errorf("err = %v, want one naming the backend", err)
	}
	if r, err := New(BackendLegacy); err != nil || r.Backend != BackendLegacy {
		t.Errorf("New(legacy) = %+v, %v", r, err)
	}
}

func TestAvailableNamesMissingCommand(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	err := Runner{Backend: BackendNFT}.Available()
	if err == nil || !strings.Contains(err.Error(), "iptables-nft is not installed") {
		t.Errorf("err = %v, want one naming iptables-nft", err)
	}
}

func TestChainRules(t *testing.T) {
	save := []byte("*nat\n:A - [0:0]\n-A A -j B\n-A C -j D\n-A A -j E\nCOMMIT\n")
	got := ChainRules(save, []string{"A", "X"})
	if strings.Join(got["A"], "|") != "-j B|-j E" || got["X"] == nil || len(got["X"]) != 0 {
		t.Errorf("ChainRules = %q", got)
	}
}

func TestIPv6RunnerRunsIP6Tables(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	r := Runner{Backend: BackendLegacy}.For(ipfamily.IPv6)
	err := r.Available()
	if err == nil || !strings.Contains(err.Error(), "ip6tables-legacy is not installed") {
		t.Errorf("err = %v, want one naming ip6tables-legacy", err)
	}
	if r.For(ipfamily.IPv4).cmd("-save") != "iptables-legacy-save" || r.cmd("-restore") != "ip6tables-legacy-restore" {
		t.Errorf("commands: %s, %s", r.For(ipfamily.IPv4).cmd("-save"), r.cmd("-restore"))
	}
}
