package conntrack

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/roottest"
)

func TestFilterArgs(t *testing.T) {
	f := Filter{Protocol: "UDP", OrigDst: netip.MustParseAddr("10.96.0.10"), OrigDstPort: 53, ReplySrc: netip.MustParseAddr("10.244.1.2")}
	args, err := f.args()
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(args); got != "[-p udp --orig-dst 10.96.0.10 --orig-port-dst 53 --reply-src 10.244.1.2]" {
		t.Errorf("args %s", got)
	}
	if _, err := (Filter{}).args(); err == nil {
		t.Error("filter without protocol accepted")
	}
}

// TestDeleteInNamespace creates UDP entries in a fresh namespace and deletes
// them selectively.
func TestDeleteInNamespace(t *testing.T) {
	roottest.Require(t)
	name := fmt.Sprintf("podnet-ct-%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v: %s", err, out)
	}
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	netns, err := ns.GetNS("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	defer netns.Close()
	err = netns.Do(func(ns.NetNS) error {
		for _, c := range [][]string{{"ip", "link", "set", "lo", "up"}, {"iptables", "-A", "OUTPUT", "-m", "conntrack", "--ctstate", "NEW", "-j", "ACCEPT"}} {
			if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%v: %v: %s", c, err, out)
			}
		}
		for _, port := range []int{5301, 5302} {
			conn, err := net.Dial("udp", fmt.Sprintf("127.0.0.1:%d", port))
			if err != nil {
				return err
			}
			conn.Write([]byte("x"))
			conn.Close()
		}
		all := Filter{Protocol: "udp", OrigDst: netip.MustParseAddr("127.0.0.1")}
		if n, err := Count(all); err != nil || n != 2 {
			return fmt.Errorf("entries before delete: %d, %v; want 2", n, err)
		}
		n, err := Delete(Filter{Protocol: "udp", OrigDst: netip.MustParseAddr("127.0.0.1"), OrigDstPort: 5301})
		if err != nil || n != 1 {
			return fmt.Errorf("deleted %d, %v; want 1", n, err)
		}
		if n, err := Count(all); err != nil || n != 1 {
			return fmt.Errorf("entries after delete: %d, %v; want 1", n, err)
		}
		if n, err := Delete(Filter{Protocol: "udp", OrigDstPort: 5999}); err != nil || n != 0 {
			return fmt.Errorf("deleting nothing: %d, %v", n, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
