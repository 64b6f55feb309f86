package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"github.com/podnet/podnet/dataplane/proxy"
)

// Mode is the ebpf proxy mode: socket LB on a cgroup for pods and the
// node, tcx programs on the uplink for traffic from outside, pinned maps.
var Mode = proxy.Mode{
	Name: "ebpf",
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

func pinDirOf(cfg proxy.Config) string {
	if cfg.BPF.PinDir != "" {
		return cfg.BPF.PinDir
	}
	return DefaultPinDir
}

// cgroupOf is the cgroup v2 directory to attach to: --bpf-cgroup resolved
// (ResolveCgroup), or the cgroup2 root this process sees.
func cgroupOf(cfg proxy.Config) (string, error) {
	if cfg.BPF.Cgroup != "" {
		return ResolveCgroup(cfg.BPF.Cgroup)
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
