package dns

import (
	"context"
	"net"
	"os"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/containernetworking/plugins/pkg/testutils"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/roottest"
)

// TestRunPortZeroSkipsATakenTCPPort: with port 0, the UDP port the kernel
// picks may be taken for TCP; Run then tries another port instead of
// failing. In a namespace of its own whose ephemeral range is two ports,
// the first of them taken for TCP.
func TestRunPortZeroSkipsATakenTCPPort(t *testing.T) {
	roottest.Require(t)
	netns, err := testutils.NewNS()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { netns.Close(); testutils.UnmountNS(netns) })
	const taken, free = 40000, 40001
	for range 5 { // the kernel picks either port: several tries meet the taken one
		err = netns.Do(func(ns.NetNS) error {
			if err := os.WriteFile("/proc/sys/net/ipv4/ip_local_port_range", []byte("40000 40001"), 0o644); err != nil {
				return err
			}
			lo, err := netlink.LinkByName("lo")
			if err != nil {
				return err
			}
			if err := netlink.LinkSetUp(lo); err != nil {
				return err
			}
			blocker, err := net.Listen("tcp", "127.0.0.1:40000")
			if err != nil {
				return err
			}
			defer blocker.Close()
			srv := NewServer(ServerOptions{Listen: []string{"127.0.0.1:0"}, Zone: NewZone(testState(), ZoneOptions{}), Sockets: 1})
			ctx, cancel := context.WithCancel(context.Background())
			ready := make(chan Listening, 1)
			go func() {
				l := <-ready
				if l.UDP[0].Port() != free || l.TCP[0].Port() != free {
					t.Errorf("bound %v, want UDP and TCP on %d (%d is taken for TCP)", l, free, taken)
				}
				cancel()
			}()
			return srv.Run(ctx, ready)
		})
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	}
}
