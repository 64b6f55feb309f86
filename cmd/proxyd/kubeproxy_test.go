package main

import (
	"bytes"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/hostnet"
)

// kubeconfigFor is a kubeconfig as kubeadm's kube-proxy ConfigMap holds it
// (key kubeconfig.conf): the API server, the pod's service-account token
// and CA by path (the pod's mount, here files in sa).
func kubeconfigFor(t *testing.T, sa, server string) string {
	for _, name := range []string{"ca.crt", "token"} {
		if err := os.WriteFile(filepath.Join(sa, name), []byte("not read before a request\n"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return `apiVersion: v1
kind: Config
clusters:
- name: default
  cluster:
    server: ` + server + `
    certificate-authority: ` + sa + `/ca.crt
contexts:
- name: default
  context: {cluster: default, namespace: default, user: default}
current-context: default
users:
- name: default
  user:
    tokenFile: ` + sa + `/token
`
}

// kubeadmConfig is the config.conf key of the kube-proxy ConfigMap kubeadm
// v1.36 writes: every field of KubeProxyConfiguration, nearly all of them
// zero (kube-proxy defaults them), the cluster CIDR from the
// ClusterConfiguration's podSubnet and the kubeconfig beside it.
func kubeadmConfig(kubeconfig string) string {
	return `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
bindAddress: 0.0.0.0
bindAddressHardFail: false
clientConnection:
  acceptContentTypes: ""
  burst: 0
  contentType: ""
  kubeconfig: ` + kubeconfig + `
  qps: 0
clusterCIDR: 10.244.0.0/16
configSyncPeriod: 0s
conntrack:
  maxPerCore: null
  min: null
  tcpBeLiberal: false
  tcpCloseWaitTimeout: null
  tcpEstablishedTimeout: null
  udpStreamTimeout: 0s
  udpTimeout: 0s
detectLocal:
  bridgeInterface: ""
  interfaceNamePrefix: ""
detectLocalMode: ""
enableProfiling: false
healthzBindAddress: ""
hostnameOverride: ""
iptables:
  localhostNodePorts: null
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
ipvs:
  excludeCIDRs: null
  minSyncPeriod: 0s
  scheduler: ""
  strictARP: false
  syncPeriod: 0s
  tcpFinTimeout: 0s
  tcpTimeout: 0s
  udpTimeout: 0s
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
metricsBindAddress: ""
mode: ""
nftables:
  masqueradeAll: false
  masqueradeBit: null
  minSyncPeriod: 0s
  syncPeriod: 0s
nodePortAddresses: null
oomScoreAdj: null
portRange: ""
showHiddenMetricsForVersion: ""
winkernel:
  enableDSR: false
  forwardHealthCheckVip: false
  networkName: ""
  rootHnsEndpointName: ""
  sourceVip: ""
`
}

// talosConfig is the KubeProxyConfiguration Talos renders when its
// machine config asks for a config file: only the fields it sets (the
// kubeconfig, the cluster CIDR, the mode, conntrack.maxPerCore 0).
func talosConfig(kubeconfig, mode string) string {
	return `apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: ` + kubeconfig + `
clusterCIDR: 10.244.0.0/16
mode: ` + mode + `
conntrack:
  maxPerCore: 0
`
}

// parseKubeProxy runs proxyd's flag and config parsing on a kube-proxy
// command line up to the agent's options, as `proxyd ARGS` would before it
// programs anything; it returns them, the flags and what was logged.
func parseKubeProxy(t *testing.T, args []string) (agent.Options, *flags, string, error) {
	t.Helper()
	var f flags
	fs := pflag.NewFlagSet("proxyd", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatalf("proxyd %q: %v", args, err)
	}
	if fs.NArg() > 0 {
		t.Fatalf("proxyd %q: stray %q", args, fs.Args())
	}
	var logs bytes.Buffer
	o, err := f.agentOptions(slog.New(slog.NewTextHandler(&logs, nil)))
	return o, &f, logs.String(), err
}

// TestKubeProxyCommandLines: the kube-proxy command lines and config files
// of kubeadm, k3s and Talos (as their sources and documentation give them)
// start proxyd with what they mean.
func TestKubeProxyCommandLines(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	kubeconfig := write("kubeconfig.conf", kubeconfigFor(t, dir, "https://192.168.10.1:6443"))
	const node = "node1" // what kubelet makes of $(NODE_NAME) from the downward API
	type want struct {
		clusterCIDR, healthz, metrics, mode string
		conntrack                           hostnet.Conntrack
	}
	for _, c := range []struct {
		name string
		args []string
		want want
	}{{
		// kubeadm's kube-proxy DaemonSet: the ConfigMap mounted at
		// /var/lib/kube-proxy, the node's name from the downward API.
		name: "kubeadm",
		args: []string{"--config=" + write("kubeadm.conf", kubeadmConfig(kubeconfig)), "--hostname-override=" + node},
		want: want{"10.244.0.0/16", "0.0.0.0:10256", "127.0.0.1:10249", "iptables", hostnet.Conntrack{Min: 131072}},
	}, {
		// k3s's agent runs kube-proxy with these (pkg/daemons/agent):
		// health on loopback by IP alone, conntrack left to the host.
		name: "k3s",
		args: []string{"--proxy-mode=iptables", "--healthz-bind-address=127.0.0.1", "--kubeconfig=" + kubeconfig,
			"--cluster-cidr=10.42.0.0/16", "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0s",
			"--conntrack-tcp-timeout-close-wait=0s", "--hostname-override=" + node},
		want: want{"10.42.0.0/16", "127.0.0.1:10256", "127.0.0.1:10249", "iptables", hostnet.Conntrack{Min: 131072}},
	}, {
		// Talos's kube-proxy DaemonSet without a config file.
		name: "talos flags",
		args: []string{"--cluster-cidr=10.244.0.0/16", "--hostname-override=" + node, "--kubeconfig=" + kubeconfig,
			"--proxy-mode=iptables", "--conntrack-max-per-core=0"},
		want: want{"10.244.0.0/16", "0.0.0.0:10256", "127.0.0.1:10249", "iptables", hostnet.Conntrack{Min: 131072}},
	}, {
		// Talos with its config file (the path of its ConfigMap mount).
		name: "talos config",
		args: []string{"--config=" + write("talos.conf", talosConfig(kubeconfig, "iptables")), "--hostname-override=" + node},
		want: want{"10.244.0.0/16", "0.0.0.0:10256", "127.0.0.1:10249", "iptables", hostnet.Conntrack{Min: 131072}},
	}} {
		t.Run(c.name, func(t *testing.T) {
			o, f, logs, err := parseKubeProxy(t, c.args)
			if err != nil {
				t.Fatalf("proxyd %q: %v", c.args, err)
			}
			if strings.Contains(logs, "not honoured") {
				t.Errorf("warnings for a stock configuration:\n%s", logs)
			}
			if o.NodeName != node || o.Kube == nil || o.Kube.Host != "https://192.168.10.1:6443" || o.StateDir != "" {
				t.Errorf("node %q, API server %v, state dir %q; want %s through %s", o.NodeName, o.Kube, o.StateDir, node, kubeconfig)
			}
			if o.Kube != nil && o.Kube.BearerTokenFile != filepath.Join(dir, "token") {
				t.Errorf("token file %q", o.Kube.BearerTokenFile)
			}
			got := want{o.ClusterCIDRs[0].String(), o.HealthzAddr, o.MetricsAddr, o.ServiceProxy.Mode.Name, f.conntrack}
			if got != c.want {
				t.Errorf("got %+v\nwant %+v", got, c.want)
			}
		})
	}
}

// TestKubeProxyConfigFields: fields proxyd honours become its flags (a
// flag on the command line wins); a field set to something proxyd does
// not do is named in a warning; an unknown field or a mode proxyd lacks is
// an error naming it.
func TestKubeProxyConfigFields(t *testing.T) {
	dir := t.TempDir()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := os.WriteFile(kubeconfig, []byte(kubeconfigFor(t, dir, "https://10.0.0.1:6443")), 0o600); err != nil {
		t.Fatal(err)
	}
	config := func(body string) string {
		p := filepath.Join(dir, "config.conf")
		if err := os.WriteFile(p, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\nclientConnection:\n  kubeconfig: "+kubeconfig+"\n"+body), 0o600); err != nil {
			t.Fatal(err)
		}
		return "--config=" + p
	}
	o, f, logs, err := parseKubeProxy(t, []string{config(`hostnameOverride: Node-7
healthzBindAddress: 0.0.0.0:20256
metricsBindAddress: 127.0.0.1
clusterCIDR: 10.100.0.0/16,fd00:10::/56
nodePortAddresses: [primary]
iptables: {masqueradeAll: true, syncPeriod: 45s, minSyncPeriod: 2s, masqueradeBit: 15}
ipvs: {scheduler: rr}
conntrack: {maxPerCore: 65536, min: 100000, tcpEstablishedTimeout: 24h, tcpCloseWaitTimeout: 1h}
enableProfiling: true
featureGates: {SomeGate: true}
`), "--healthz-bind-address=127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	if o.NodeName != "node-7" || o.HealthzAddr != "127.0.0.2:10256" || o.MetricsAddr != "127.0.0.1:10249" ||
		!slices.Equal(o.ClusterCIDRs, []netip.Prefix{netip.MustParsePrefix("10.100.0.0/16"), netip.MustParsePrefix("fd00:10::/56")}) || o.SyncPeriod != 45*time.Second || o.MinSyncPeriod != 2*time.Second ||
		!f.masqueradeAll || !slices.Equal(f.nodePortAddresses, []string{"primary"}) {
		t.Errorf("options %+v, masquerade-all %v, nodeport-addresses %q", o, f.masqueradeAll, f.nodePortAddresses)
	}
	if want := (hostnet.Conntrack{MaxPerCore: 65536, Min: 100000, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}); f.conntrack != want {
		t.Errorf("conntrack %+v, want %+v", f.conntrack, want)
	}
	for _, field := range []string{"iptables.masqueradeBit", "ipvs.scheduler", "enableProfiling", "featureGates.SomeGate"} {
		if !strings.Contains(logs, field) {
			t.Errorf("no warning names %s:\n%s", field, logs)
		}
	}

	// A dual-stack clusterCIDR is the cluster's two families, no warning.
	if strings.Contains(logs, "clusterCIDR") {
		t.Errorf("a warning names the dual-stack clusterCIDR:\n%s", logs)
	}

	for _, c := range []struct{ body, want string }{
		{"bogusField: 1\n", `unknown field "bogusField"`},
		{"clusterCIDR: 10.100.0.0/16,10.101.0.0/16\n", "--cluster-cidr: \"10.100.0.0/16,10.101.0.0/16\": 10.100.0.0/16 and 10.101.0.0/16 are both IPv4"},
		{"iptables: {masqueradeBits: 14}\n", `unknown field "masqueradeBits"`},
		{"mode: ipvs\n", `mode "ipvs": proxyd's modes are`},
		{"healthzBindAddress: localhost:10256\n", `--healthz-bind-address "localhost:10256"`},
	} {
		if _, _, _, err := parseKubeProxy(t, []string{config(c.body)}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v; want an error with %q", c.body, err, c.want)
		}
	}
	if !slices.Contains(modes.Names(), "nftables") {
		if _, _, _, err := parseKubeProxy(t, []string{config("mode: nftables\n")}); err == nil || !strings.Contains(err.Error(), `mode "nftables"`) {
			t.Errorf("Talos's default mode nftables: %v; want an error naming it", err)
		}
	}
}

func TestBindAddress(t *testing.T) {
	for in, want := range map[string]string{"": "", "127.0.0.1": "127.0.0.1:10256", "::1": "[::1]:10256", "0.0.0.0:1": "0.0.0.0:1", ":9": ":9", "[::]:7": "[::]:7"} {
		if got, err := bindAddress("healthz-bind-address", in, "10256"); err != nil || got != want {
			t.Errorf("%q: %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := bindAddress("healthz-bind-address", "nohost", "10256"); err == nil || !strings.Contains(err.Error(), "--healthz-bind-address") {
		t.Errorf("nohost: %v", err)
	}
}
