package iptables_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/roottest"
)

// netnsLab is a node namespace routing between a client and a server
// namespace, the smallest place a Service VIP can be tested for real.
type netnsLab struct {
	node, client, server ns.NetNS
}

func sh(t testing.TB, args ...string) {
	t.Helper()
	if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
}

func newNetnsLab(t testing.TB, tag string) *netnsLab {
	t.Helper()
	prefix := fmt.Sprintf("podnet-svc%d-%s", os.Getpid(), tag)
	names := map[string]string{"node": prefix + "-n", "client": prefix + "-c", "server": prefix + "-s"}
	for _, n := range names {
		sh(t, "ip", "netns", "add", n)
		t.Cleanup(func() { exec.Command("ip", "netns", "del", n).Run() })
	}
	n, c, s := names["node"], names["client"], names["server"]
	sh(t, "ip", "-n", n, "link", "set", "lo", "up")
	sh(t, "ip", "netns", "exec", n, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	// An uplink with a default route, as a real node has: Service VIPs are
	// routed there unless DNATed.
	sh(t, "ip", "-n", n, "link", "add", "uplink", "type", "veth", "peer", "name", "uplink-peer")
	sh(t, "ip", "-n", n, "link", "set", "uplink-peer", "up")
	sh(t, "ip", "-n", n, "addr", "add", "192.168.10.11/24", "dev", "uplink")
	sh(t, "ip", "-n", n, "link", "set", "uplink", "up")
	sh(t, "ip", "-n", n, "route", "add", "default", "via", "192.168.10.1")
	for _, p := range []struct{ peer, nodeAddr, peerAddr, gw string }{
		{c, "10.244.2.1/24", "10.244.2.5/24", "10.244.2.1"},
		{s, "10.244.1.1/24", "10.244.1.5/24", "10.244.1.1"},
	} {
		sh(t, "ip", "-n", n, "link", "add", "eth-"+p.peer[len(p.peer)-1:], "type", "veth", "peer", "name", "eth0", "netns", p.peer)
		sh(t, "ip", "-n", n, "addr", "add", p.nodeAddr, "dev", "eth-"+p.peer[len(p.peer)-1:])
		sh(t, "ip", "-n", n, "link", "set", "eth-"+p.peer[len(p.peer)-1:], "up")
		sh(t, "ip", "-n", p.peer, "link", "set", "lo", "up")
		sh(t, "ip", "-n", p.peer, "addr", "add", p.peerAddr, "dev", "eth0")
		sh(t, "ip", "-n", p.peer, "link", "set", "eth0", "up")
		sh(t, "ip", "-n", p.peer, "route", "add", "default", "via", p.gw)
	}
	l := &netnsLab{}
	for name, dst := range map[string]*ns.NetNS{"node": &l.node, "client": &l.client, "server": &l.server} {
		h, err := ns.GetNS("/run/netns/" + names[name])
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { h.Close() })
		*dst = h
	}
	return l
}

// serve accepts TCP connections in the server namespace and writes each
// client's address back.
func (l *netnsLab) serve(t testing.TB, addr string) {
	t.Helper()
	var ln net.Listener
	err := l.server.Do(func(ns.NetNS) error {
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

// dial connects from a namespace and returns what the server wrote.
func dial(from ns.NetNS, addr string) (string, error) {
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

func TestRealApplyInNamespace(t *testing.T) {
	roottest.Require(t)
	for _, backend := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		t.Run(backend, func(t *testing.T) {
			roottest.Tool(t, "iptables-"+backend+"-restore", "iptables")
			l := newNetnsLab(t, backend[:3])
			l.serve(t, "10.244.1.5:8080")
			l.serve(t, "10.244.1.5:8081")

			web := svc("web", "10.96.0.20", []cluster.ServicePort{tcp(80, 0)})
			empty := svc("empty", "10.96.0.30", []cluster.ServicePort{tcp(80, 0)})
			server := ep{a("10.244.1.5"), "node-b", true}
			ports := world(web, slice(web, []cluster.EndpointPort{epPort("p80", cluster.TCP, 8080)}, server), empty)
			p := iptables.NewProxier(defaultCfg, iptables.ExecRunner{Backend: backend})
			sync := func(full bool) {
				t.Helper()
				if err := l.node.Do(func(ns.NetNS) error { _, err := p.Sync(ports, nil, full); return err }); err != nil {
					t.Fatal(err)
				}
			}
			sync(true)

			got, err := dial(l.client, "10.96.0.20:80")
			if err != nil || !strings.HasPrefix(got, "10.244.2.5:") || !strings.HasSuffix(got, "via 10.244.1.5:8080") {
				t.Fatalf("pod → ClusterIP: %q, %v; want the endpoint to see the pod's own address", got, err)
			}
			got, err = dial(l.node, "10.96.0.20:80")
			if err != nil || !strings.HasPrefix(got, "10.244.1.1:") {
				t.Errorf("node → ClusterIP: %q, %v; want masqueraded to the node's address", got, err)
			}

			start := time.Now()
			_, err = dial(l.client, "10.96.0.30:80")
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Errorf("Service without endpoints: %v after %v; want connection refused within 1s", err, time.Since(start))
			}

			// A partial sync moves the Service to another port.
			ports = world(web, slice(web, []cluster.EndpointPort{epPort("p80", cluster.TCP, 8081)}, server), empty)
			sync(false)
			if got, err := dial(l.client, "10.96.0.20:80"); err != nil || !strings.HasSuffix(got, "via 10.244.1.5:8081") {
				t.Errorf("after a partial sync: %q, %v", got, err)
			}

			var save []byte
			if err := l.node.Do(func(ns.NetNS) error {
				if err := iptables.Cleanup(iptables.ExecRunner{Backend: backend}); err != nil {
					return err
				}
				var err error
				save, err = exec.Command("iptables-" + backend + "-save").Output()
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(string(save), "PODSVC") {
				t.Errorf("cleanup left rules:\n%s", save)
			}
		})
	}
}

// TestDetectBackend: the backend holding rules wins, as in kube-proxy's
// iptables-wrapper.
func TestDetectBackend(t *testing.T) {
	roottest.Require(t)
	for _, b := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		roottest.Tool(t, "iptables-"+b+"-save", "iptables")
	}
	l := newNetnsLab(t, "det")
	for _, tc := range []struct{ backend, other string }{
		{iptables.BackendLegacy, iptables.BackendNFT},
		{iptables.BackendNFT, iptables.BackendLegacy},
	} {
		err := l.node.Do(func(ns.NetNS) error {
			for _, c := range [][]string{
				{"iptables-" + tc.other, "-F"},
				{"iptables-" + tc.backend, "-A", "INPUT", "-s", "192.0.2.1", "-j", "ACCEPT"},
				{"iptables-" + tc.backend, "-A", "INPUT", "-s", "192.0.2.2", "-j", "ACCEPT"},
			} {
				if out, err := exec.Command(c[0], c[1:]...).CombinedOutput(); err != nil {
					return fmt.Errorf("%v: %v: %s", c, err, out)
				}
			}
			if got := iptables.DetectBackend(); got != tc.backend {
				return fmt.Errorf("detected %s with rules only in %s", got, tc.backend)
			}
			return nil
		})
		if err != nil {
			t.Error(err)
		}
	}
}

// TestRealIptablesAcceptsEveryRuleForm applies the golden scenario (every
// kind of Service: NodePort, externalIPs, load balancer with source ranges,
// both traffic policies, affinity, SCTP, no endpoints) to real iptables
// with both backends, then a partial sync and a cleanup.
func TestRealIptablesAcceptsEveryRuleForm(t *testing.T) {
	roottest.Require(t)
	for _, backend := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		t.Run(backend, func(t *testing.T) {
			roottest.Tool(t, "iptables-"+backend+"-restore", "iptables")
			l := newNetnsLab(t, "f"+backend[:3])
			err := l.node.Do(func(ns.NetNS) error {
				r := iptables.ExecRunner{Backend: backend}
				p := iptables.NewProxier(iptables.Config{ClusterCIDR: clusterCIDR, MasqueradeAll: true}, r)
				if _, err := p.Sync(scenario(), nil, true); err != nil {
					return fmt.Errorf("full sync: %w", err)
				}
				ports := scenario()
				for k, sps := range ports {
					if k.Name == "local" {
						sps[0].LocalEndpoints = nil
					}
				}
				if _, err := p.Sync(ports, nil, false); err != nil {
					return fmt.Errorf("partial sync: %w", err)
				}
				// A second proxier (a restart) finds the jumps in place.
				if _, err := iptables.NewProxier(iptables.Config{ClusterCIDR: clusterCIDR}, r).Sync(scenario(), nil, true); err != nil {
					return fmt.Errorf("sync after restart: %w", err)
				}
				save, err := exec.Command("iptables-" + backend + "-save").Output()
				if err != nil {
					return err
				}
				if n := strings.Count(string(save), iptables.JumpComment); n != len(iptables.Jumps) {
					return fmt.Errorf("%d jumps after a restart, want %d:\n%s", n, len(iptables.Jumps), save)
				}
				if err := iptables.Cleanup(r); err != nil {
					return err
				}
				save, err = exec.Command("iptables-" + backend + "-save").Output()
				if err != nil {
					return err
				}
				if strings.Contains(string(save), "PODSVC") {
					return fmt.Errorf("cleanup left:\n%s", save)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
