// Command proxyd is podnet's per-node agent and service proxy.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/app"
	"github.com/podnet/podnet/dataplane/cli"
	"github.com/podnet/podnet/dataplane/cluster/kube"
	"github.com/podnet/podnet/dataplane/cluster/statedir"
	"github.com/podnet/podnet/dataplane/hostnet"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/ipt"
	"github.com/podnet/podnet/dataplane/nodeconfig"
	"github.com/podnet/podnet/dataplane/nodenet"
	"github.com/podnet/podnet/dataplane/podcidr"
	"github.com/podnet/podnet/dataplane/policy"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/routing"
)

func main() {
	os.Exit(command().Main(os.Args[1:], os.Stdout, os.Stderr))
}

// daemon is proxyd's command line: the agent with its flags, and the
// subcommands.
func command() app.Daemon {
	var f flags
	return app.Daemon{
		Name:    "proxyd",
		Summary: "podnet's node agent (the node's pod network, routes to other nodes) and Service proxy",
		Subcommands: []cli.Subcommand{
			{Name: "status", Summary: "print what the proxyd running on this node has programmed", Run: runStatus},
			{Name: "init", Summary: "set the sysctls proxyd needs and exit (a privileged init container)", Run: runInit},
		},
		Flags: f.register,
		Setup: f.setup,
	}
}

// flags is proxyd's command line.
type flags struct {
	o                 agent.Options
	clusterCIDR       string
	backend           string
	proxyMode         string
	nodePortAddresses []string
	masqueradeAll     bool
	localProbe        time.Duration
	cleanup           bool
	kubeconfig        string
	modeSettings      map[string]proxy.Settings
	limits            statedir.LimitFlags
	// kube-proxy's command line and config file.
	config           string
	hostnameOverride string
	bindAddress      string
	healthz, metrics string
	conntrack        hostnet.Conntrack
	migration        migration
	fs               *pflag.FlagSet
}

// register registers every flag into fs, with its default.
func (f *flags) register(fs *pflag.FlagSet) {
	hostname, _ := os.Hostname()
	o := &f.o
	fs.StringVar(&o.NodeName, "node-name", hostname, "this node's name in the cluster state")
	fs.StringVar(&f.kubeconfig, "kubeconfig", "", "kubeconfig of the API server to read the cluster from (default: in-cluster config, unless --state-dir is set)")
	fs.StringVar(&o.StateDir, "state-dir", "", "directory of Kubernetes objects (YAML/JSON) to read the cluster state from instead of the API server")
	fs.BoolVar(&o.AllocateNodeCIDRs, "allocate-node-cidrs", false, "claim a free subnet of each --cluster-cidr (/24 for IPv4, /64 for IPv6) for a node without spec.podCIDRs (when kube-controller-manager does not allocate them)")
	fs.StringVar(&o.ClaimNamespace, "claim-namespace", claimNamespace(), "namespace of the Leases that claim podCIDRs with --allocate-node-cidrs (default: $POD_NAMESPACE, else "+podcidr.DefaultNamespace+")")
	fs.StringVar(&f.clusterCIDR, "cluster-cidr", "10.244.0.0/16", "the pod network of the whole cluster: one prefix, or one per family for dual-stack (10.244.0.0/16,fd00:10:244::/56); the node serves the families given")
	fs.StringVar(&f.backend, "backend", string(routing.BackendAuto), "how to reach other nodes' pods: auto (host-gw on this node's subnet, VXLAN beyond), host-gw or vxlan")
	fs.IntVar(&o.VXLANVNI, "vxlan-vni", routing.DefaultVNI, "VXLAN network identifier")
	fs.IntVar(&o.VXLANPort, "vxlan-port", routing.DefaultPort, "VXLAN UDP port")
	fs.StringVar(&o.Iface, "iface", "", "underlay interface (default: the interface holding the node's InternalIP)")
	fs.StringVar(&o.NodeConfigPath, "node-config", nodeconfig.DefaultPath, "where to write the node config for the CNI plugin")
	fs.BoolVar(&o.Masquerade, "masquerade", true, "masquerade pod traffic leaving the cluster CIDR to the node's address")
	fs.StringVar(&f.proxyMode, "proxy-mode", proxy.DefaultMode, "Service proxy: "+strings.Join(modes.Names(), ", "))
	fs.StringVar(&f.healthz, "healthz-bind-address", "0.0.0.0:10256", "address of /healthz: IP:PORT, or an IP alone for port 10256 (empty disables)")
	fs.StringVar(&f.metrics, "metrics-bind-address", "127.0.0.1:10249", "address of /metrics: IP:PORT, or an IP alone for port 10249 (empty disables)")
	fs.DurationVar(&o.SyncPeriod, "sync-period", 30*time.Second, "full resync period of routes and rules")
	fs.DurationVar(&o.MinSyncPeriod, "min-sync-period", time.Second, "minimum time between syncs")
	fs.StringSliceVar(&f.nodePortAddresses, "nodeport-addresses", nil, "CIDRs whose node addresses accept NodePorts, or \"primary\" for the Node's InternalIPs (default: all)")
	fs.BoolVar(&f.masqueradeAll, "masquerade-all", false, "masquerade all traffic sent to Service IPs")
	fs.DurationVar(&f.localProbe, "local-endpoint-probe-interval", 100*time.Millisecond, "how often to connect to a TCP port of this node's endpoints of Services with trafficDistribution PreferSameNode; one that refuses is not used until it accepts again (0: never)")
	f.modeSettings = modes.AddFlags(fs)
	fs.BoolVar(&o.NetworkPolicy, "network-policy", true, "enforce NetworkPolicy for this node's pods (nftables table inet "+policy.TableName+", every proxy mode); reads Pods and NetworkPolicies")
	fs.Uint16Var(&o.PolicyLogGroup, "network-policy-log-group", 24, "nflog group that denied new connections are logged to (rate-limited)")
	fs.BoolVar(&f.cleanup, "cleanup", false, "remove everything proxyd installed and exit")
	f.migration.register(fs)
	f.limits.Register(fs)
	// kube-proxy's, so its command lines and config file run proxyd.
	fs.StringVar(&f.config, "config", "", "kube-proxy's config file (KubeProxyConfiguration, "+kubeProxyAPIVersion+"): the fields proxyd honours become its flags (a flag given on the command line wins), the others are named in a warning")
	fs.StringVar(&f.hostnameOverride, "hostname-override", "", "kube-proxy's name for --node-name; wins over it when set")
	fs.StringVar(&f.bindAddress, "bind-address", "0.0.0.0", "kube-proxy's override of the node's primary IP; proxyd takes the node's address from its Node's InternalIP and warns when this names another")
	registerConntrack(fs, &f.conntrack)
	f.fs = fs
}

// registerConntrack registers kube-proxy's conntrack flags (also proxyd
// init's, which sets them in a privileged init container).
func registerConntrack(fs *pflag.FlagSet, c *hostnet.Conntrack) {
	fs.IntVar(&c.MaxPerCore, "conntrack-max-per-core", 0, "grow nf_conntrack_max to this many entries per CPU (0 leaves it as it is; kube-proxy's default is 32768)")
	fs.IntVar(&c.Min, "conntrack-min", 131072, "with --conntrack-max-per-core: nf_conntrack_max at least this")
	fs.DurationVar(&c.TCPEstablishedTimeout, "conntrack-tcp-timeout-established", 0, "nf_conntrack_tcp_timeout_established (0 leaves it as it is)")
	fs.DurationVar(&c.TCPCloseWaitTimeout, "conntrack-tcp-timeout-close-wait", 0, "nf_conntrack_tcp_timeout_close_wait (0 leaves it as it is)")
}

// setup checks the flags and returns what proxyd runs: the agent with its
// health, or with --cleanup the removal of what it installed.
func (f *flags) setup(logger *slog.Logger) (app.Run, error) {
	if f.cleanup {
		return app.Run{Main: func(context.Context, *app.Health) error {
			return errors.Join(nodenet.Cleanup(logger), modes.Cleanup(proxy.Config{Logger: logger, Settings: f.modeSettings}, ""), policy.Cleanup())
		}}, nil
	}
	o, err := f.agentOptions(logger)
	if err != nil {
		return app.Run{}, err
	}
	return app.Run{Health: o.HealthEndpoint(), Main: func(ctx context.Context, h *app.Health) error {
		// As kube-proxy does at start; where /proc/sys is read-only,
		// proxyd init (the privileged init container) sets them.
		if err := hostnet.EnsureConntrack(hostnet.ProcSysctl{}, f.conntrack, runtime.NumCPU()); err != nil {
			logger.Warn("conntrack settings not applied; give proxyd init the same --conntrack-* flags", "err", err)
		}
		logger.Info("node agent", "node", o.NodeName, "backend", o.Backend, "proxyMode", f.proxyMode)
		o.Health = h
		return agent.Run(ctx, o)
	}}, nil
}

// agentOptions applies --config, then turns the flags into the agent's
// options.
func (f *flags) agentOptions(logger *slog.Logger) (agent.Options, error) {
	if f.config != "" {
		c, err := readKubeProxyConfig(f.config)
		if err != nil {
			return agent.Options{}, err
		}
		warnings, err := c.applyTo(f.fs)
		if err != nil {
			return agent.Options{}, err
		}
		for _, w := range warnings {
			logger.Warn("kube-proxy setting not honoured", "config", f.config, "setting", w)
		}
	}
	return f.options(logger)
}

// kubeProxyFlags puts kube-proxy's flags into o: the node's name, the
// HTTP addresses (an IP alone takes the default port), and checks the
// others.
func (f *flags) kubeProxyFlags(o *agent.Options, logger *slog.Logger) error {
	var err error
	if f.hostnameOverride != "" {
		o.NodeName = strings.ToLower(strings.TrimSpace(f.hostnameOverride))
	}
	if o.HealthzAddr, err = bindAddress("healthz-bind-address", f.healthz, "10256"); err != nil {
		return err
	}
	if o.MetricsAddr, err = bindAddress("metrics-bind-address", f.metrics, "10249"); err != nil {
		return err
	}
	if a, err := netip.ParseAddr(f.bindAddress); err != nil {
		return fmt.Errorf("--bind-address %q: not an IP address", f.bindAddress)
	} else if !a.IsUnspecified() {
		logger.Warn("--bind-address is not used: proxyd takes the node's address from its Node's InternalIP", "bind-address", a)
	}
	return f.conntrack.Validate()
}

// options turns the flags into the agent's options, the Service proxy's
// mode chosen and probed: a mode this node cannot run is refused here,
// before anything is touched. Errors name the flag.
func (f *flags) options(logger *slog.Logger) (agent.Options, error) {
	o := f.o
	var err error
	if o.ClusterCIDRs, err = ipfamily.ParsePrefixes(f.clusterCIDR); err != nil {
		return o, fmt.Errorf("--cluster-cidr: %w", err)
	}
	o.Backend = routing.Backend(f.backend)
	if err := f.kubeProxyFlags(&o, logger); err != nil {
		return o, err
	}
	var npa []netip.Prefix
	primary := false
	for _, s := range f.nodePortAddresses {
		if strings.TrimSpace(s) == "primary" {
			primary = true
			continue
		}
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return o, fmt.Errorf("--nodeport-addresses: %w", err)
		}
		npa = append(npa, p.Masked())
	}
	if o.StateLimits, err = f.limits.Limits(); err != nil {
		return o, err
	}
	if f.kubeconfig != "" || o.StateDir == "" {
		if o.Kube, err = kube.ClientConfig(f.kubeconfig); err != nil {
			return o, err
		}
	}
	o.Logger = logger
	if err := o.Validate(); err != nil {
		return o, err
	}
	// One nft/legacy detection for the node's chains and the proxy's.
	o.IPTables = ipt.Runner{Backend: ipt.NodeBackend()}
	if f.localProbe < 0 {
		return o, fmt.Errorf("--local-endpoint-probe-interval: %v is negative", f.localProbe)
	}
	sp := proxy.ServiceOptions{Modes: modes, Conntrack: conntrackNetlink{}, LocalProbeInterval: f.localProbe, Config: proxy.Config{
		NodeName: o.NodeName, ClusterCIDR: o.ClusterCIDRs[0], ClusterCIDRs: o.ClusterCIDRs, NodePortAddresses: npa,
		MasqueradeAll: f.masqueradeAll, Settings: f.modeSettings,
	}}
	if o.Iface != "" {
		sp.Config.Uplinks = []string{o.Iface}
	}
	if sp.Mode, err = modes.Select(f.proxyMode, sp.Config); err != nil {
		return o, err
	}
	if primary {
		if len(npa) > 0 {
			return o, fmt.Errorf("--nodeport-addresses: primary and CIDRs %v: choose one", npa)
		}
		sp.Mode = nodePortsPrimary(sp.Mode)
	}
	if err := f.migration.apply(&o, &sp, logger); err != nil {
		return o, err
	}
	o.ServiceProxy = &sp
	return o, nil
}
