package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// kubeProxyConfiguration is kube-proxy's config file
// (kubeproxy.config.k8s.io/v1alpha1, the config.conf key of the ConfigMap
// kubeadm writes), every field of it, so that a strict decode refuses only
// what kube-proxy would refuse too. Pointers tell "not set" from zero.
type kubeProxyConfiguration struct {
	APIVersion       string          `json:"apiVersion"`
	Kind             string          `json:"kind"`
	FeatureGates     map[string]bool `json:"featureGates"`
	ClientConnection struct {
		Kubeconfig         string  `json:"kubeconfig"`
		AcceptContentTypes string  `json:"acceptContentTypes"`
		ContentType        string  `json:"contentType"`
		QPS                float32 `json:"qps"`
		Burst              int32   `json:"burst"`
	} `json:"clientConnection"`
	Logging struct {
		Format         string `json:"format"`
		FlushFrequency any    `json:"flushFrequency"`
		Verbosity      int    `json:"verbosity"`
		VModule        any    `json:"vmodule"`
		Options        any    `json:"options"`
	} `json:"logging"`
	HostnameOverride            string `json:"hostnameOverride"`
	BindAddress                 string `json:"bindAddress"`
	HealthzBindAddress          string `json:"healthzBindAddress"`
	MetricsBindAddress          string `json:"metricsBindAddress"`
	BindAddressHardFail         bool   `json:"bindAddressHardFail"`
	EnableProfiling             bool   `json:"enableProfiling"`
	ShowHiddenMetricsForVersion string `json:"showHiddenMetricsForVersion"`
	Mode                        string `json:"mode"`
	IPTables                    struct {
		MasqueradeBit      *int32          `json:"masqueradeBit"`
		MasqueradeAll      bool            `json:"masqueradeAll"`
		LocalhostNodePorts *bool           `json:"localhostNodePorts"`
		SyncPeriod         metav1.Duration `json:"syncPeriod"`
		MinSyncPeriod      metav1.Duration `json:"minSyncPeriod"`
	} `json:"iptables"`
	IPVS     map[string]any `json:"ipvs"`
	NFTables struct {
		MasqueradeBit *int32          `json:"masqueradeBit"`
		MasqueradeAll bool            `json:"masqueradeAll"`
		SyncPeriod    metav1.Duration `json:"syncPeriod"`
		MinSyncPeriod metav1.Duration `json:"minSyncPeriod"`
	} `json:"nftables"`
	Winkernel       map[string]any `json:"winkernel"`
	DetectLocalMode string         `json:"detectLocalMode"`
	DetectLocal     struct {
		BridgeInterface     string `json:"bridgeInterface"`
		InterfaceNamePrefix string `json:"interfaceNamePrefix"`
	} `json:"detectLocal"`
	ClusterCIDR       string   `json:"clusterCIDR"`
	NodePortAddresses []string `json:"nodePortAddresses"`
	OOMScoreAdj       *int32   `json:"oomScoreAdj"`
	Conntrack         struct {
		MaxPerCore            *int32           `json:"maxPerCore"`
		Min                   *int32           `json:"min"`
		TCPEstablishedTimeout *metav1.Duration `json:"tcpEstablishedTimeout"`
		TCPCloseWaitTimeout   *metav1.Duration `json:"tcpCloseWaitTimeout"`
		TCPBeLiberal          bool             `json:"tcpBeLiberal"`
		UDPTimeout            metav1.Duration  `json:"udpTimeout"`
		UDPStreamTimeout      metav1.Duration  `json:"udpStreamTimeout"`
	} `json:"conntrack"`
	ConfigSyncPeriod    metav1.Duration `json:"configSyncPeriod"`
	PortRange           string          `json:"portRange"`
	WindowsRunAsService bool            `json:"windowsRunAsService"`
}

const (
	kubeProxyAPIVersion = "kubeproxy.config.k8s.io/v1alpha1"
	kubeProxyKind       = "KubeProxyConfiguration"
)

// readKubeProxyConfig reads and strictly decodes a KubeProxyConfiguration:
// an unknown field is an error naming it.
func readKubeProxyConfig(path string) (*kubeProxyConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--config: %w", err)
	}
	var c kubeProxyConfiguration
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("--config %s: %w", path, err)
	}
	if c.APIVersion != kubeProxyAPIVersion || c.Kind != kubeProxyKind {
		return nil, fmt.Errorf("--config %s: apiVersion %q kind %q: want %s %s", path, c.APIVersion, c.Kind, kubeProxyAPIVersion, kubeProxyKind)
	}
	return &c, nil
}

// applyTo sets the flags c says something about, unless the command line
// set them (kube-proxy gives the file precedence; proxyd lets an explicit
// flag win, so a DaemonSet can override one setting). It returns what
// proxyd does not honour, each naming the field; an error for a field
// whose value proxyd cannot run with.
func (c *kubeProxyConfiguration) applyTo(fs *pflag.FlagSet) (warnings []string, err error) {
	set := func(flag, value string) error {
		if value == "" || fs.Changed(flag) {
			return nil
		}
		if err := fs.Set(flag, value); err != nil {
			return fmt.Errorf("--config: %w", err)
		}
		fs.Lookup(flag).Changed = false // still "not on the command line"
		return nil
	}
	dur := func(d metav1.Duration) string {
		if d.Duration == 0 {
			return ""
		}
		return d.Duration.String()
	}
	ptr := func(p *int32) string {
		if p == nil {
			return ""
		}
		return strconv.Itoa(int(*p))
	}
	pdur := func(p *metav1.Duration) string {
		if p == nil {
			return ""
		}
		return p.Duration.String()
	}
	mode := c.Mode
	if mode == "" {
		mode = modes[0].Name
	}
	if !slices.Contains(modes.Names(), mode) {
		return nil, fmt.Errorf("--config: mode %q: proxyd's modes are %s", c.Mode, strings.Join(modes.Names(), ", "))
	}
	errs := []error{
		set("kubeconfig", c.ClientConnection.Kubeconfig),
		set("hostname-override", c.HostnameOverride),
		set("bind-address", c.BindAddress),
		set("healthz-bind-address", c.HealthzBindAddress),
		set("metrics-bind-address", c.MetricsBindAddress),
		set("proxy-mode", mode),
		set("cluster-cidr", c.ClusterCIDR),
		set("nodeport-addresses", strings.Join(c.NodePortAddresses, ",")),
		set("conntrack-max-per-core", ptr(c.Conntrack.MaxPerCore)),
		set("conntrack-min", ptr(c.Conntrack.Min)),
		set("conntrack-tcp-timeout-established", pdur(c.Conntrack.TCPEstablishedTimeout)),
		set("conntrack-tcp-timeout-close-wait", pdur(c.Conntrack.TCPCloseWaitTimeout)),
	}
	// The sync periods and masquerade-all of the mode that runs.
	sync, minSync, masqAll := c.IPTables.SyncPeriod, c.IPTables.MinSyncPeriod, c.IPTables.MasqueradeAll
	if mode == "nftables" {
		sync, minSync, masqAll = c.NFTables.SyncPeriod, c.NFTables.MinSyncPeriod, c.NFTables.MasqueradeAll
	}
	errs = append(errs, set("sync-period", dur(sync)), set("min-sync-period", dur(minSync)))
	if masqAll {
		errs = append(errs, set("masquerade-all", "true"))
	}
	return append(warnings, c.unhonoured()...), errors.Join(errs...)
}

// unhonoured lists the fields set to something proxyd does not do.
func (c *kubeProxyConfiguration) unhonoured() []string {
	var w []string
	note := func(cond bool, field, why string) {
		if cond {
			w = append(w, field+": "+why)
		}
	}
	for gate := range c.FeatureGates {
		w = append(w, "featureGates."+gate+": proxyd has no feature gates; ignored")
	}
	note(c.ClientConnection.QPS != 0 || c.ClientConnection.Burst != 0, "clientConnection.qps/burst", "proxyd uses client-go's defaults; ignored")
	note(c.ClientConnection.ContentType != "" || c.ClientConnection.AcceptContentTypes != "", "clientConnection.contentType", "proxyd asks for protobuf; ignored")
	note(c.Logging.Format != "" && c.Logging.Format != "text", "logging.format", "set --log-format on the command line; ignored")
	note(c.Logging.Verbosity != 0, "logging.verbosity", "set -v on the command line; ignored")
	note(c.EnableProfiling, "enableProfiling", "proxyd serves no pprof; ignored")
	note(c.ShowHiddenMetricsForVersion != "", "showHiddenMetricsForVersion", "proxyd hides no metrics; ignored")
	note(c.IPTables.MasqueradeBit != nil && *c.IPTables.MasqueradeBit != 14, "iptables.masqueradeBit", "proxyd marks with its own bit; ignored")
	note(c.IPTables.LocalhostNodePorts != nil && *c.IPTables.LocalhostNodePorts, "iptables.localhostNodePorts", "proxyd never accepts NodePorts on 127.0.0.1 (route_localnet); ignored")
	note(len(nonZero(c.IPVS)) > 0, "ipvs."+strings.Join(nonZero(c.IPVS), ",ipvs."), "proxyd has no ipvs mode; ignored")
	note(len(nonZero(c.Winkernel)) > 0, "winkernel", "Windows only; ignored")
	note(c.DetectLocalMode != "" && c.DetectLocalMode != "ClusterCIDR", "detectLocalMode "+c.DetectLocalMode, "proxyd tells pod traffic by --cluster-cidr; ignored")
	note(c.DetectLocal.BridgeInterface != "" || c.DetectLocal.InterfaceNamePrefix != "", "detectLocal", "proxyd tells pod traffic by --cluster-cidr; ignored")
	note(c.OOMScoreAdj != nil, "oomScoreAdj", "set by the container runtime for a pod; ignored")
	note(c.Conntrack.TCPBeLiberal, "conntrack.tcpBeLiberal", "not set by proxyd; ignored")
	note(c.Conntrack.UDPTimeout.Duration != 0 || c.Conntrack.UDPStreamTimeout.Duration != 0, "conntrack.udpTimeout/udpStreamTimeout", "not set by proxyd; ignored")
	note(c.ConfigSyncPeriod.Duration != 0, "configSyncPeriod", "proxyd's watches do not resync; ignored")
	note(c.PortRange != "", "portRange", "userspace mode only; ignored")
	return w
}

// nonZero lists the keys of m whose values are not a zero value (kubeadm
// writes every field of a section, most of them zero).
func nonZero(m map[string]any) []string {
	var out []string
	for k, v := range m {
		switch v := v.(type) {
		case nil:
		case string:
			if v != "" && v != "0s" {
				out = append(out, k)
			}
		case bool:
			if v {
				out = append(out, k)
			}
		case float64:
			if v != 0 {
				out = append(out, k)
			}
		case []any:
			if len(v) > 0 {
				out = append(out, k)
			}
		default:
			out = append(out, k)
		}
	}
	return out
}

// bindAddress is an HTTP listen address given as kube-proxy takes it: IP
// and port, or an IP alone for the default port; "" disables.
func bindAddress(flag, v, defaultPort string) (string, error) {
	if v == "" {
		return "", nil
	}
	if _, err := netip.ParseAddrPort(v); err == nil {
		return v, nil
	}
	if a, err := netip.ParseAddr(v); err == nil {
		return net.JoinHostPort(a.String(), defaultPort), nil
	}
	if host, port, err := net.SplitHostPort(v); err == nil && host == "" {
		return ":" + port, nil
	}
	return "", fmt.Errorf("--%s %q: want IP, IP:PORT or :PORT", flag, v)
}

// nodePortsPrimary wraps mode m so NodePorts are accepted on this node's
// primary addresses only (--nodeport-addresses primary, as kube-proxy's):
// the InternalIPs of its Node, as the cluster state holds them at the
// Service proxy's first sync, which comes after the state is loaded.
func nodePortsPrimary(m proxy.Mode) proxy.Mode {
	newBackend := m.New
	if newBackend == nil {
		return m
	}
	m.New = func(cfg proxy.Config) (proxy.Backend, error) {
		return &primaryBackend{cfg: cfg, new: newBackend}, nil
	}
	return m
}

type primaryBackend struct {
	cfg proxy.Config
	new func(proxy.Config) (proxy.Backend, error)
	b   proxy.Backend
}

// nodePrimaryPrefixes are the host prefixes of n's InternalIPs.
func nodePrimaryPrefixes(n *cluster.Node) []netip.Prefix {
	var out []netip.Prefix
	for _, f := range ipfamily.All {
		if ip, ok := n.InternalIP(f); ok {
			out = append(out, ipfamily.Host(ip))
		}
	}
	return out
}

func (p *primaryBackend) Sync(ports map[cluster.Key][]*proxy.ServicePort, changed map[cluster.Key]bool, full bool) (proxy.SyncResult, error) {
	if p.b == nil {
		n := p.cfg.Node()
		if n == nil {
			return proxy.SyncResult{}, fmt.Errorf("--nodeport-addresses primary: node %q is not in the cluster state", p.cfg.NodeName)
		}
		cfg := p.cfg
		if cfg.NodePortAddresses = nodePrimaryPrefixes(n); len(cfg.NodePortAddresses) == 0 {
			return proxy.SyncResult{}, fmt.Errorf("--nodeport-addresses primary: node %q has no InternalIP", p.cfg.NodeName)
		}
		b, err := p.new(cfg)
		if err != nil {
			return proxy.SyncResult{}, err
		}
		p.cfg.Logger.Info("NodePorts on the node's primary addresses", "addresses", fmt.Sprint(cfg.NodePortAddresses))
		p.b = b
	}
	return p.b.Sync(ports, changed, full)
}

func (p *primaryBackend) Close() error {
	if c, ok := p.b.(io.Closer); ok {
		return c.Close()
	}
	return nil
}
