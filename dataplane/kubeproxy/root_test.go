package kubeproxy

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/roottest"
)

// TestCleanupRealNode: in a namespace holding what kube-proxy leaves on a
// node (iptables mode's chains beside flannel's, kubelet's canaries and
// podnet's, an nftables mode table, IPVS mode's dummy device), Cleanup
// removes kube-proxy's and nothing else; a TCP connection kube-proxy's
// rules DNATed to a local server keeps working across it, and a second
// Cleanup finds nothing.
func TestCleanupRealNode(t *testing.T) {
	roottest.Tool(t, "iptables-nft-restore", "iptables")
	netns := netnsOf(t)
	r := ipt.Runner{Backend: ipt.BackendNFT, Family: ipfamily.IPv4}
	save, err := os.ReadFile("testdata/kube-proxy.save")
	if err != nil {
		t.Fatal(err)
	}
	// The Service of the save file, 10.96.0.1:443, DNATed to a server on
	// the node itself.
	save = []byte(strings.ReplaceAll(string(save), "192.0.2.1:6443", "192.0.2.1:16443"))
	var conn net.Conn
	err = netns.Do(func(ns.NetNS) error {
		if err := setUpNode(save); err != nil {
			return err
		}
		ln, err := net.Listen("tcp", "192.0.2.1:16443")
		if err != nil {
			return err
		}
		t.Cleanup(func() { ln.Close() })
		go echo(ln)
		conn, err = net.DialTimeout("tcp", "10.96.0.1:443", 5*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	rd := bufio.NewReader(conn)
	roundTrip(t, conn, rd, "before")

	var rep Report
	err = netns.Do(func(ns.NetNS) error {
		var err error
		rep, err = Cleanup(Options{IPTables: []ipt.Runner{r}})
		return err
	})
	// Without ipvsadm and ipset the IPVS leftovers are named; the rest
	// is removed all the same.
	if err != nil && !strings.Contains(err.Error(), "IPVS virtual servers remain") {
		t.Fatalf("Cleanup: %v", err)
	}
	if len(rep.Chains) != 15 || len(rep.NFTTables) != 2 || len(rep.Links) != 1 {
		t.Errorf("report: %+v", rep)
	}
	roundTrip(t, conn, rd, "after")

	var after []byte
	_ = netns.Do(func(ns.NetNS) error {
		after, err = r.SaveAll()
		return err
	})
	for _, keep := range []string{":KUBE-KUBELET-CANARY", ":KUBE-IPTABLES-HINT", "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD", "-A OUTPUT -m comment --comment \"podnet service portals\" -j PODNET-SERVICES", "-A FLANNEL-POSTRTG"} {
		if !strings.Contains(string(after), keep) {
			t.Errorf("%s is gone:\n%s", keep, after)
		}
	}
	for _, l := range strings.Split(string(after), "\n") {
		if strings.Contains(l, "KUBE-") && !strings.Contains(l, "KUBE-KUBELET-CANARY") && !strings.Contains(l, "KUBE-IPTABLES-HINT") {
			t.Errorf("left behind: %s", l)
		}
	}
	_ = netns.Do(func(ns.NetNS) error {
		c, err := nftables.New()
		if err != nil {
			return err
		}
		tables, _ := c.ListTables()
		names := map[string]bool{}
		for _, tb := range tables {
			names[tb.Name] = true
		}
		// iptables-nft's own tables and someone else's stay
		if names[NFTTable] || !names["keep"] || !names["nat"] || !names["filter"] {
			t.Errorf("nftables tables after: %v", names)
		}
		if _, err := netlink.LinkByName(IPVSDevice); err == nil {
			t.Errorf("%s left", IPVSDevice)
		}
		rep, err = Cleanup(Options{IPTables: []ipt.Runner{r}})
		if err != nil || !rep.Empty() {
			t.Errorf("second Cleanup: %+v, %v", rep, err)
		}
		return nil
	})
}

// setUpNode puts kube-proxy's leftovers in the namespace: save's chains,
// its nftables tables beside one of someone else's, its dummy device, and
// a device routing the Service CIDR so a ClusterIP can be dialled.
func setUpNode(save []byte) error {
	for _, args := range [][]string{
		{"link", "set", "lo", "up"},
		// veth pairs: this kernel may lack the dummy module
		{"link", "add", "eth0", "type", "veth", "peer", "name", "eth0p"},
		{"addr", "add", "192.0.2.1/24", "dev", "eth0"},
		{"link", "set", "eth0p", "up"},
		{"link", "set", "eth0", "up"},
		{"route", "add", "10.96.0.0/12", "dev", "eth0"},
		{"link", "add", IPVSDevice, "type", "veth", "peer", "name", "ipvsp"},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
	}
	c := exec.Command("iptables-nft-restore")
	c.Stdin = strings.NewReader(string(save))
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-nft-restore: %v: %s", err, out)
	}
	nc, err := nftables.New()
	if err != nil {
		return err
	}
	// kube-proxy's nftables mode's tables (iptables-nft's own tables are
	// "nat", "filter", "mangle": untouched)
	nc.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv4, Name: NFTTable})
	nc.AddTable(&nftables.Table{Family: nftables.TableFamilyIPv6, Name: NFTTable})
	nc.AddTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: "keep"})
	return nc.Flush()
}

func echo(ln net.Listener) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			rd := bufio.NewReader(c)
			for {
				l, err := rd.ReadString('\n')
				if err != nil {
					return
				}
				if _, err := c.Write([]byte(l)); err != nil {
					return
				}
			}
		}()
	}
}

func roundTrip(t *testing.T, c net.Conn, rd *bufio.Reader, msg string) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := fmt.Fprintln(c, msg); err != nil {
		t.Fatalf("%s: write: %v", msg, err)
	}
	got, err := rd.ReadString('\n')
	if err != nil || got != msg+"\n" {
		t.Fatalf("%s: read %q, %v", msg, got, err)
	}
}

// netnsOf is a network namespace of the test's own.
func netnsOf(t *testing.T) ns.NetNS {
	_, n := roottest.NetNS(t, "podnet-kp")
	return n
}
