package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/spf13/pflag"

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
	New: func(cfg proxy.Config) (proxy.Backend, error) {
		if cfg.Family != ipfamily.IPv4 {
			// bpf/ parses IPv4 packets and keys its maps by 32-bit
			// addresses.
			return nil, fmt.Errorf("ebpf mode serves IPv4 only, not %v", cfg.Family)
		}
		cg, err := cgroupOf(cfg)
		if err != nil {
			return nil, err
		}
		cfg.Logger.Info("service proxy: ebpf mode", "cgroup", cg, "pinDir", pinDirOf(cfg))
		return NewProxier(Config{
			PinDir:            pinDirOf(cfg),
			Cgroup:            cg,
			NodePortAddresses: cfg.NodePortAddresses,
			NodeIP: func() netip.Addr {
				if n := cfg.Node(); n != nil {
					if ip, ok := n.InternalIP(cfg.Family); ok {
						return ip
					}
				}
				return netip.Addr{}
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
