package proxytest

import (
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/roottest"
)

// NetnsLab is a node namespace routing between a client and a server
// namespace, the smallest place a Service VIP can be tested for real:
//
//	client 10.244.2.5 ── 10.244.2.1 node 10.244.1.1 ── 10.244.1.5 server
//
// The node also has an uplink, 192.168.10.11/24 with a default route via
// 192.168.10.1, as a real node has: a Service VIP not DNATed is routed
// there. Everything is removed when the test ends.
type NetnsLab struct {
	Node, Client, Server ns.NetNS
}

// Sh runs a command and fails t with its output if it fails.
func Sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

// NewNetnsLab builds the lab; tag keeps the namespaces of one test apart.
func NewNetnsLab(t testing.TB, tag string) *NetnsLab {
	t.Helper()
	roottest.Require(t)
	roottest.Tool(t, "ip", "iproute2")
	prefix := fmt.Sprintf("podnet-px%d-%s", os.Getpid(), tag)
	names := map[string]string{"node": prefix + "-n", "client": prefix + "-c", "server": prefix + "-s"}
	for _, n := range names {
		Sh(t, "ip", "netns", "add", n)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
	}
	n, c, s := names["node"], names["client"], names["server"]
	Sh(t, "ip", "-n", n, "link", "set", "lo", "up")
	Sh(t, "ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	Sh(t, "ip", "-n", n, "link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer")
	Sh(t, "ip", "-n", n, "link", "set", "uplink-peer", "up")
	Sh(t, "ip", "-n", n, "addr", "add", "192.168.10.11/24", "dev", "uplink")
	Sh(t, "ip", "-n", n, "link", "set", "uplink", "up")
	Sh(t, "ip", "-n", n, "route", "add", "default", "via", "192.168.10.1")
	for _, p := range []struct{ peer, nodeAddr, peerAddr, gw string }{
		{c, "10.244.2.1/24", "10.244.2.5/24", "10.244.2.1"},
		{s, "10.244.1.1/24", "10.244.1.5/24", "10.244.1.1"},
	} {
		dev := "eth-" + p.peer[len(p.peer)-1:]
		Sh(t, "ip", "-n", n, "link", "add", dev, "type", "veth", "peer", "name", "eth0", "netns", p.peer)
		Sh(t, "ip", "-n", n, "addr", "add", p.nodeAddr, "dev", dev)
		Sh(t, "ip", "-n", n, "link", "set", dev, "up")
		Sh(t, "ip", "-n", p.peer, "link", "set", "lo", "up")
		Sh(t, "ip", "-n", p.peer, "addr", "add", p.peerAddr, "dev", "eth0")
		Sh(t, "ip", "-n", p.peer, "link", "set", "eth0", "up")
		Sh(t, "ip", "-n", p.peer, "route", "add", "default", "via", p.gw)
	}
	l := &NetnsLab{}
	for name, dst := range map[string]*ns.NetNS{"node": &l.Node, "client": &l.Client, "server": &l.Server} {
		h, err := ns.GetNS("/run/netns/" + names[name])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		*dst = h
	}
	return l
}

// Serve accepts TCP connections on addr in the server namespace and writes
// each client's address back: "CLIENT via ADDR".
func (l *NetnsLab) Serve(t testing.TB, addr string) {
	t.Helper()
	var ln net.Listener
	err := l.Server.Do(func(ns.NetNS) error {
		var err error
		ln, err = net.Listen("tcp", addr)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(c, "%s via %s", c.RemoteAddr(), addr)
			c.Close()
		}
	}()
}

// Dial connects from a namespace and returns what the server wrote.
func Dial(from ns.NetNS, addr string) (string, error) {
	var reply string
	err := from.Do(func(ns.NetNS) error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(2 * time.Second))
		b, err := io.ReadAll(c)
		reply = string(b)
		return err
	})
	return reply, err
}
