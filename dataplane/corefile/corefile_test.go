package corefile

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// TestConvertKubeadmCorefile: kubeadm's Corefile (v1.36's: its cache
// block disables caching for cluster.local, which dnsd never caches) with a hosts entry and a
// stub domain becomes dnsd's config (the stub domain, the host, the
// default upstreams of /etc/resolv.conf) and flags (the kubernetes
// plugin's ttl and pods, errors, prometheus, max_concurrent); its
// loadbalance, which dnsd cannot honour, refuses the whole Corefile naming
// it and its line, unless dropped.
func TestConvertKubeadmCorefile(t *testing.T) {
	src, err := os.ReadFile("testdata/kubeadm-stub.Corefile")
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := Parse(string(src))
	if err != nil {
		t.Fatal(err)
	}
	if len(blocks) != 2 || blocks[1].Keys[0] != "corp.example:53" || len(blocks[0].Directives) != 11 {
		t.Fatalf("parsed %+v", blocks)
	}
	if _, err := Convert(blocks, nil); err == nil || !strings.Contains(err.Error(), "line 22: loadbalance") {
		t.Errorf("err = %v, want loadbalance refused with its line", err)
	}
	res, err := Convert(blocks, []string{"loadbalance"})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"--log-errors", "--pods=insecure", "--ttl=30", "--metrics-address=:9153", "--max-concurrent=1000"}; !slices.Equal(res.Flags, want) {
		t.Errorf("flags %q, want %q", res.Flags, want)
	}
	c := res.Config
	if c.UpstreamNameservers != nil || !reflect.DeepEqual(c.StubDomains, map[string][]string{"corp.example": {"10.1.0.53", "10.1.0.54:5353"}}) ||
		!reflect.DeepEqual(c.Hosts, map[string][]string{"registry.internal": {"192.0.2.10"}}) {
		t.Errorf("config %+v", c)
	}
}

// TestConvertRefusesEachPlugin: every plugin dnsd cannot honour is named
// with its line, all in one error.
func TestConvertRefusesEachPlugin(t *testing.T) {
	src := `. {
  rewrite name foo.example bar.example
  hosts /etc/coredns/hosts
  forward . tls://9.9.9.9 {
    tls_servername dns.quad9.net
  }
  kubernetes cluster.local {
    endpoint_pod_names
  }
  cache 30 {
    disable success
    disable denial example.org
    disable success cluster.local
  }
}
`
	blocks, err := Parse(src)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Convert(blocks, nil)
	for _, want := range []string{"line 2: rewrite", "line 3: hosts", "line 4: forward (tls://9.9.9.9: only plain DNS upstreams)", "line 8: endpoint_pod_names", "line 11: disable", "line 12: disable"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("err = %v, want it to name %q", err, want)
		}
	}
	if err == nil || strings.Contains(err.Error(), "line 13") {
		t.Errorf("err = %v: disable for the kubernetes plugin's own zone is what dnsd does, not refused", err)
	}
}

// TestParseErrors: a block never closed and an unclosed quote are named
// with their lines.
func TestParseErrors(t *testing.T) {
	for src, want := range map[string]string{
		".:53 {\n  errors\n":       "line 1: { never closed",
		".:53 {\n  hosts \"a\n}\n": "line 2: quote never closed",
		"example.org:5353 {\n}\n":  "port 5353",
	} {
		blocks, err := Parse(src)
		if err == nil {
			_, err = Convert(blocks, nil)
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: err = %v, want %q", src, err, want)
		}
	}
}
