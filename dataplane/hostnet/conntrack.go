package hostnet

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Conntrack is kube-proxy's conntrack table settings (its --conntrack-*
// flags and the conntrack section of its config file). Zero leaves the
// kernel's value as it is, as kube-proxy's 0 does.
type Conntrack struct {
	// MaxPerCore sizes nf_conntrack_max as MaxPerCore × CPUs, at least
	// Min; the table is only ever grown.
	MaxPerCore, Min       int
	TCPEstablishedTimeout time.Duration
	TCPCloseWaitTimeout   time.Duration
}

// The conntrack sysctls, by /proc/sys path.
const (
	sysctlConntrackMax       = "net/netfilter/nf_conntrack_max"
	sysctlTCPEstablished     = "net/netfilter/nf_conntrack_tcp_timeout_established"
	sysctlTCPCloseWait       = "net/netfilter/nf_conntrack_tcp_timeout_close_wait"
	errConntrackNotInInitNet = "nf_conntrack_max can be set only from the node's own network namespace"
)

// Validate names the flag that is wrong.
func (c Conntrack) Validate() error {
	switch {
	case c.MaxPerCore < 0:
		return fmt.Errorf("--conntrack-max-per-core: %d is negative", c.MaxPerCore)
	case c.Min < 0:
		return fmt.Errorf("--conntrack-min: %d is negative", c.Min)
	case c.TCPEstablishedTimeout < 0:
		return fmt.Errorf("--conntrack-tcp-timeout-established: %v is negative", c.TCPEstablishedTimeout)
	case c.TCPCloseWaitTimeout < 0:
		return fmt.Errorf("--conntrack-tcp-timeout-close-wait: %v is negative", c.TCPCloseWaitTimeout)
	}
	return nil
}

// EnsureConntrack gives the conntrack sysctls c's values on a node of cpus
// CPUs: nf_conntrack_max raised to MaxPerCore × cpus (at least Min) when
// it is lower, the TCP timeouts set in whole seconds. Where /proc/sys is
// read-only and a value differs, the error wraps ErrSysctlReadOnly and
// names the sysctl and the flag. Every setting is tried.
func EnsureConntrack(s Sysctl, c Conntrack, cpus int) error {
	if err := c.Validate(); err != nil {
		return err
	}
	var errs []error
	if c.MaxPerCore > 0 {
		want := max(c.MaxPerCore*cpus, c.Min)
		got, err := s.Get(sysctlConntrackMax)
		have, perr := strconv.Atoi(strings.TrimSpace(got))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("--conntrack-max-per-core: read %s: %w", sysctlConntrackMax, err))
		case perr != nil:
			errs = append(errs, fmt.Errorf("--conntrack-max-per-core: %s holds %q: %w", sysctlConntrackMax, got, perr))
		case have < want:
			if err := ensure(s, sysctlConntrackMax, strconv.Itoa(want)); err != nil {
				errs = append(errs, fmt.Errorf("--conntrack-max-per-core (%s): %w", errConntrackNotInInitNet, err))
			}
		}
	}
	for _, t := range []struct {
		flag, sysctl string
		d            time.Duration
	}{
		{"--conntrack-tcp-timeout-established", sysctlTCPEstablished, c.TCPEstablishedTimeout},
		{"--conntrack-tcp-timeout-close-wait", sysctlTCPCloseWait, c.TCPCloseWaitTimeout},
	} {
		if t.d <= 0 {
			continue
		}
		if err := ensure(s, t.sysctl, strconv.Itoa(int(t.d/time.Second))); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.flag, err))
		}
	}
	return errors.Join(errs...)
}
