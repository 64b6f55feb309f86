package proxy

import (
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/spf13/pflag"
)

// DefaultMode is the mode a daemon runs unless told otherwise, as
// kube-proxy does.
const DefaultMode = "iptables"

// Settings are one mode's own configuration, which no other part of the
// daemon reads: the flags it adds to the command line. A mode finds its
// own in Config.Settings under its name.
type Settings interface {
	AddFlags(fs *pflag.FlagSet)
}

var registry struct {
	sync.Mutex
	modes Modes
}

// Register adds m to the modes a daemon offers. A mode's package calls it
// from init, so a daemon offers a mode by importing its package, and a new
// mode is a new package plus that import. Two modes of one name are a
// programming error.
func Register(m Mode) {
	registry.Lock()
	defer registry.Unlock()
	if slices.ContainsFunc(registry.modes, func(o Mode) bool { return o.Name == m.Name }) {
		panic(fmt.Sprintf("proxy mode %q registered twice", m.Name))
	}
	registry.modes = append(registry.modes, m)
}

// Registered returns the registered modes: DefaultMode first, then by
// name, None last.
func Registered() Modes {
	registry.Lock()
	defer registry.Unlock()
	out := slices.Clone(registry.modes)
	rank := func(m Mode) int {
		switch m.Name {
		case DefaultMode:
			return 0
		case None.Name:
			return 2
		}
		return 1
	}
	slices.SortFunc(out, func(a, b Mode) int {
		if d := rank(a) - rank(b); d != 0 {
			return d
		}
		return strings.Compare(a.Name, b.Name)
	})
	return out
}

// AddFlags makes each mode's Settings and registers their flags into fs;
// the result goes into Config.Settings.
func (ms Modes) AddFlags(fs *pflag.FlagSet) map[string]Settings {
	out := make(map[string]Settings)
	for _, m := range ms {
		if m.NewSettings != nil {
			s := m.NewSettings()
			s.AddFlags(fs)
			out[m.Name] = s
		}
	}
	return out
}

func init() { Register(None) }
