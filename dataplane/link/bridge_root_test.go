package link_test

import (
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/link"
	"github.com/podnet/podnet/dataplane/roottest"
)

// TestBridgeSkipsDAD: the bridge podnet creates, and one it finds down,
// come up with IPv6 duplicate address detection off, so the bridge's
// link-local address is usable at once and the first packet to a new pod
// does not wait a second for its neighbour solicitation.
func TestBridgeSkipsDAD(t *testing.T) {
	roottest.Require(t)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Close(); testutils.UnmountNS(netns) })
	err = netns.Do(func(ns.NetNS) error {
		for _, name := range []string{"cbr0", "cbr1"} {
			if name == "cbr1" {
				// Found down: created by someone else, with DAD on.
				if _, err := link.Bridge(name, 1500, link.RandomMAC()); err != nil {
					return err
				}
				l, err := netlink.LinkByName(name)
				if err != nil {
					return err
				}
				if err := netlink.LinkSetDown(l); err != nil {
					return err
				}
				if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+name+"/accept_dad", []byte("1"), 0o644); err != nil {
					return err
				}
			}
			if _, err := link.Bridge(name, 1500, link.RandomMAC()); err != nil {
				return err
			}
			if got, err := link.IPv6Conf(name, "accept_dad"); err != nil || got != "0" {
				t.Errorf("%s: accept_dad %q, %v; want 0", name, got, err)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
