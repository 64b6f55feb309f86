package hostnet

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// kube-proxy's conntrack settings: the table only grows, to max-per-core ×
// CPUs but at least min; timeouts in seconds; 0 leaves a value alone; a
// read-only /proc/sys names the sysctl and the flag.
func TestEnsureConntrack(t *testing.T) {
	vals := func() map[string]string {
		return map[string]string{sysctlConntrackMax: "65536", sysctlTCPEstablished: "432000", sysctlTCPCloseWait: "60"}
	}
	for _, c := range []struct {
		name string
		c    Conntrack
		cpus int
		want map[string]string
	}{
		{"zero leaves all", Conntrack{}, 4, vals()},
		{"grown to per-core x cpus", Conntrack{MaxPerCore: 32768, Min: 131072, TCPEstablishedTimeout: 24 * time.Hour, TCPCloseWaitTimeout: time.Hour}, 8,
			map[string]string{sysctlConntrackMax: "262144", sysctlTCPEstablished: "86400", sysctlTCPCloseWait: "3600"}},
		{"at least min", Conntrack{MaxPerCore: 32768, Min: 131072}, 2,
			map[string]string{sysctlConntrackMax: "131072", sysctlTCPEstablished: "432000", sysctlTCPCloseWait: "60"}},
		{"never shrunk", Conntrack{MaxPerCore: 1024}, 2, vals()},
	} {
		s := &fakeSysctl{vals: vals()}
		if err := EnsureConntrack(s, c.c, c.cpus); err != nil {
			t.Errorf("%s: %v", c.name, err)
		}
		for k, v := range c.want {
			if s.vals[k] != v {
				t.Errorf("%s: %s = %s, want %s", c.name, k, s.vals[k], v)
			}
		}
	}
	s := &fakeSysctl{vals: vals(), readOnly: true}
	err := EnsureConntrack(s, Conntrack{MaxPerCore: 32768, TCPCloseWaitTimeout: time.Hour}, 4)
	if !errors.Is(err, ErrSysctlReadOnly) || !strings.Contains(err.Error(), "--conntrack-max-per-core") ||
		!strings.Contains(err.Error(), "--conntrack-tcp-timeout-close-wait") || !strings.Contains(err.Error(), sysctlTCPCloseWait) {
		t.Errorf("read-only: %v; want both flags and the sysctl named", err)
	}
	if err := EnsureConntrack(s, Conntrack{MaxPerCore: -1}, 4); err == nil || !strings.Contains(err.Error(), "--conntrack-max-per-core") {
		t.Errorf("negative: %v", err)
	}
}
