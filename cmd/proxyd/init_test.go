package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cli"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/roottest"
)

// TestInitSetsEachFamily: `proxyd init --cluster-cidr v4,v6`, in a network
// namespace of the test's own, turns on forwarding and br_netfilter's hook
// of both families and says which; a --cluster-cidr of two IPv4 prefixes
// is refused, naming them.
func TestInitSetsEachFamily(t *testing.T) {
	roottest.Require(t)
	_, netns := roottest.NetNS(t, "podnet-init")
	var stdout, stderr bytes.Buffer
	err := netns.Do(func(ns.NetNS) error {
		if code := runInit([]string{"--cluster-cidr", "10.244.0.0/16,fd00:10:244::/56"}, &stdout, &stderr); code != cli.ExitOK {
			return fmt.Errorf("exit %d: %s", code, stderr.String())
		}
		for _, k := range []string{"net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding", "net/bridge/bridge-nf-call-iptables", "net/bridge/bridge-nf-call-ip6tables"} {
			if v, err := (hostnet.ProcSysctl{}).Get(k); v != "1" {
				return fmt.Errorf("%s = %q (%v), want 1", k, v, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if want := "net.ipv6.conf.all.forwarding=1 net.bridge.bridge-nf-call-ip6tables=1"; !strings.Contains(stdout.String(), want) {
		t.Errorf("stdout %q lacks %q", stdout.String(), want)
	}
	stderr.Reset()
	// In the test's namespace too, though it is refused before any write.
	_ = netns.Do(func(ns.NetNS) error {
		if code := runInit([]string{"--cluster-cidr", "10.244.0.0/16,10.245.0.0/16"}, &stdout, &stderr); code != cli.ExitUsage || !strings.Contains(stderr.String(), "both IPv4") {
			t.Errorf("two IPv4 prefixes: exit %d, %q", code, stderr.String())
		}
		return nil
	})
}
