package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Mode is the ebpf proxy mode: socket LB on a cgroup for pods and the
// node, tcx programs on the uplink for traffic from outside, pinned maps.
var Mode = proxy.Mode{
	Name:        modeName,
	NewSettings: func() proxy.Settings { return &Settings{PinDir: DefaultPinDir} },
	Probe: func(cfg proxy.Config) error {
		if err := Probe(); err != nil {
			return err
		}
		_, err := cgroupOf(cfg)
		return err
	},
	// One Proxier serves every family: the maps key both by 16-byte
	// addresses (bpf/lb.h).
	AllFamilies: true,
	New: func(cfg proxy.Config) (proxy.Backend, error) {
		cg, err := cgroupOf(cfg)
		if err != nil {
			return nil, err
		}
		families := cfg.Families
		if len(families) == 0 {
			families = []ipfamily.Family{cfg.Family}
		}
		cfg.Logger.Info("service proxy: ebpf mode", "cgroup", cg, "pinDir", pinDirOf(cfg), "families", families)
		return NewProxier(Config{
			PinDir:            pinDirOf(cfg),
			Cgroup:            cg,
			NodePortAddresses: cfg.NodePortAddresses,
			NodeIPs: func() []netip.Addr {
				return internalIPs(cfg.Node, families)
			},
			Uplinks: cfg.Uplinks,
			Logger:  cfg.Logger,
		}), nil
	},
	Cleanup: func(cfg proxy.Config) error {
		return Cleanup(pinDirOf(cfg))
	},
}

const modeName = "ebpf"

// internalIPs are the node's InternalIPs of families, one per family it
// has one of, in the order of families (none while the node is unknown):
// the SNAT addresses and where the uplinks are found.
func internalIPs(node func() *cluster.Node, families []ipfamily.Family) []netip.Addr {
	var n *cluster.Node
	if node != nil {
		n = node()
	}
	if n == nil {
		return nil
	}
	var out []netip.Addr
	for _, f := range families {
		if ip, ok := n.InternalIP(f); ok && !slices.Contains(out, ip) {
			out = append(out, ip)
		}
	}
	return out
}

func init() { proxy.Register(Mode) }

// Settings are the ebpf mode's own.
type Settings struct {
	// Cgroup is the cgroup v2 directory the socket hooks attach to.
	Cgroup string
	// PinDir is the bpffs directory holding the pinned maps and links.
	PinDir string
}

// AddFlags implements proxy.Settings.
func (s *Settings) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&s.Cgroup, "bpf-cgroup", s.Cgroup, "ebpf mode: the cgroup v2 directory whose processes get socket-level load balancing, or a hybrid host's cgroup root holding it at unified/ (default: the cgroup2 root this process sees)")
	fs.StringVar(&s.PinDir, "bpf-pin-dir", s.PinDir, "ebpf mode: where maps and links are pinned (a bpffs is mounted there if needed)")
}

// settingsOf is the mode's Settings in cfg, else the defaults.
func settingsOf(cfg proxy.Config) Settings {
	if s, ok := cfg.Settings[modeName].(*Settings); ok && s != nil {
		return *s
	}
	return Settings{}
}

func pinDirOf(cfg proxy.Config) string {
	if s := settingsOf(cfg); s.PinDir != "" {
		return s.PinDir
	}
	return DefaultPinDir
}

// cgroupOf is the cgroup v2 directory to attach to: --bpf-cgroup resolved
// (ResolveCgroup), or the cgroup2 root this process sees.
func cgroupOf(cfg proxy.Config) (string, error) {
	if s := settingsOf(cfg); s.Cgroup != "" {
		return ResolveCgroup(s.Cgroup)
	}
	return Cgroup2Root()
}

// Cgroup2Root is where the cgroup v2 hierarchy is mounted: /sys/fs/cgroup
// on a unified host, /sys/fs/cgroup/unified on a hybrid one.
func Cgroup2Root() (string, error) {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return "", fmt.Errorf("find cgroup2 mount: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if fields := strings.Fields(sc.Text()); len(fields) >= 3 && fields[2] == "cgroup2" {
			return fields[1], nil
		}
	}
	return "", errors.New("ebpf mode needs a cgroup v2 hierarchy; none is mounted (or pass --bpf-cgroup)")
}
