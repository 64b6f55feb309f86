package iptables_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
	"github.com/podnet/podnet/dataplane/proxy/proxytest"
	"github.com/podnet/podnet/dataplane/roottest"
)

func TestRealApplyInNamespace(t *testing.T) {
	roottest.Require(t)
	for _, backend := range []string{iptables.BackendNFT, iptables.BackendLegacy} {
		t.Run(backend, func(t *testing.T) {
			roottest.Tool(t, "iptables-"+backend+"-restore", "iptables")
			l := proxytest.NewNetnsLab(t, backend[:3])
			l.Serve(t, "10.244.1.5:8080")
			l.Serve(t, "10.244.1.5:8081")

			web := proxytest.Svc("web", "10.96.0.20", []cluster.ServicePort{proxytest.TCP(80, 0)})
			empty := proxytest.Svc("empty", "10.96.0.30", []cluster.ServicePort{proxytest.TCP(80, 0)})
			server := proxytest.EP(proxytest.A("10.244.1.5"), "node-b", true)
			ports := proxytest.World(web, proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8080)}, server), empty)
			p := iptables.NewProxier(defaultCfg, iptables.ExecRunner{Backend: backend})
			sync := func(full bool) {
				t.Helper()
				if err := l.Node.Do(func(ns.NetNS) error { _, err := p.Sync(ports, nil, full); return err }); err != nil {
					t.Fatal(err)
				}
			}
			sync(true)

			got, err := proxytest.Dial(l.Client, "10.96.0.20:80")
			if err != nil || !strings.HasPrefix(got, "10.244.2.5:") || !strings.HasSuffix(got, "via 10.244.1.5:8080") {
				t.Fatalf("pod → ClusterIP: %q, %v; want the endpoint to see the pod's own address", got, err)
			}
			got, err = proxytest.Dial(l.Node, "10.96.0.20:80")
			if err != nil || !strings.HasPrefix(got, "10.244.1.1:") {
				t.Errorf("node → ClusterIP: %q, %v; want masqueraded to the node's address", got, err)
			}

			start := time.Now()
			_, err = proxytest.Dial(l.Client, "10.96.0.30:80")
			if !errors.Is(err, syscall.ECONNREFUSED) || time.Since(start) > time.Second {
				t.Errorf("Service without endpoints: %v after %v; want connection refused within 1s", err, time.Since(start))
			}

			// A partial sync moves the Service to another port.
			ports = proxytest.World(web, proxytest.Slice(web, []cluster.EndpointPort{proxytest.EPPort("p80", cluster.TCP, 8081)}, server), empty)
			sync(false)
			if got, err := proxytest.Dial(l.Client, "10.96.0.20:80"); err != nil || !strings.HasSuffix(got, "via 10.244.1.5:8081") {
				t.Errorf("after a partial sync: %q, %v", got, err)
			}

			var save []byte
			if err := l.Node.Do(func(ns.NetNS) error {
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
	l := proxytest.NewNetnsLab(t, "det")
	for _, tc := range []struct{ backend, other string }{
		{iptables.BackendLegacy, iptables.BackendNFT},
		{iptables.BackendNFT, iptables.BackendLegacy},
	} {
		err := l.Node.Do(func(ns.NetNS) error {
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
			l := proxytest.NewNetnsLab(t, "f"+backend[:3])
			err := l.Node.Do(func(ns.NetNS) error {
				r := iptables.ExecRunner{Backend: backend}
				p := iptables.NewProxier(iptables.Config{ClusterCIDR: proxytest.ClusterCIDR, MasqueradeAll: true}, r)
				if _, err := p.Sync(proxytest.Scenario(), nil, true); err != nil {
					return fmt.Errorf("full sync: %w", err)
				}
				ports := proxytest.Scenario()
				for k, sps := range ports {
					if k.Name == "local" {
						sps[0].LocalEndpoints = nil
					}
				}
				if _, err := p.Sync(ports, nil, false); err != nil {
					return fmt.Errorf("partial sync: %w", err)
				}
				// A second proxier (a restart) finds the jumps in place.
				if _, err := iptables.NewProxier(iptables.Config{ClusterCIDR: proxytest.ClusterCIDR}, r).Sync(proxytest.Scenario(), nil, true); err != nil {
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
