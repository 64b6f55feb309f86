package ipt

import (
	"strings"
	"testing"
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
