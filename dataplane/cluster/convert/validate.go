package convert

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	v1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// Limits are the settings of an API server that decide which Services it
// accepts. With the Kubernetes API as source the API server has already
// refused what breaks them; a state directory has no API server, so its
// objects are checked against these before use (a port of 70000 would
// otherwise wrap to 4464, and a cluster IP outside the range take over an
// address pods use).
type Limits struct {
	// ServiceCIDRs is --service-cluster-ip-range: one prefix per family.
	ServiceCIDRs []netip.Prefix
	// NodePorts is --service-node-port-range.
	NodePorts PortRange
}

// PortRange is an inclusive range of ports.
type PortRange struct{ Min, Max int }

func (r PortRange) String() string { return fmt.Sprintf("%d-%d", r.Min, r.Max) }

// DefaultServiceCIDR and DefaultNodePorts are kube-apiserver's defaults.
var (
	DefaultServiceCIDR = netip.MustParsePrefix("10.96.0.0/12")
	DefaultNodePorts   = PortRange{30000, 32767}
)

// DefaultLimits are kube-apiserver's defaults.
func DefaultLimits() Limits {
	return Limits{ServiceCIDRs: []netip.Prefix{DefaultServiceCIDR}, NodePorts: DefaultNodePorts}
}

// ParseServiceCIDRs reads --service-cluster-ip-range: one or two prefixes
// (one per family), comma-separated, as kube-apiserver takes it.
func ParseServiceCIDRs(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(s, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			return nil, fmt.Errorf("service CIDR %q: %w", f, err)
		}
		for _, q := range out {
			if q.Addr().Is4() == p.Addr().Is4() {
				return nil, fmt.Errorf("service CIDRs %q: at most one per address family", s)
			}
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// ParsePortRange reads --service-node-port-range: "MIN-MAX" (or "MIN+N",
// N more ports after MIN, as kube-apiserver also takes).
func ParsePortRange(s string) (PortRange, error) {
	var r PortRange
	lo, hi, plus := strings.Cut(s, "+")
	if !plus {
		lo, hi, _ = strings.Cut(s, "-")
	}
	var err1, err2 error
	r.Min, err1 = strconv.Atoi(strings.TrimSpace(lo))
	n, err2 := strconv.Atoi(strings.TrimSpace(hi))
	if err1 != nil || err2 != nil {
		return r, fmt.Errorf("port range %q: want MIN-MAX", s)
	}
	r.Max = n
	if plus {
		r.Max = r.Min + n
	}
	if r.Min < 1 || r.Max > 65535 || r.Min > r.Max {
		return r, fmt.Errorf("port range %q: want 1 <= MIN <= MAX <= 65535", s)
	}
	return r, nil
}

func validPort(field string, p int32) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("%s: %d is not a port (1-65535)", field, p)
	}
	return nil
}

// ValidateV1Service refuses what kube-apiserver with limits l would refuse
// among the fields the dataplane reads: ports outside 1-65535, nodePorts
// (and healthCheckNodePort) outside the node-port range, cluster IPs that
// are not addresses of the service range. The error names the field.
func ValidateV1Service(s *v1.Service, l Limits) error {
	for i, p := range s.Spec.Ports {
		if err := validPort(fmt.Sprintf("spec.ports[%d].port", i), p.Port); err != nil {
			return err
		}
		if p.TargetPort.Type == intstr.Int && p.TargetPort.IntVal != 0 {
			if err := validPort(fmt.Sprintf("spec.ports[%d].targetPort", i), p.TargetPort.IntVal); err != nil {
				return err
			}
		}
		if err := l.validNodePort(fmt.Sprintf("spec.ports[%d].nodePort", i), p.NodePort); err != nil {
			return err
		}
	}
	if err := l.validNodePort("spec.healthCheckNodePort", s.Spec.HealthCheckNodePort); err != nil {
		return err
	}
	ips, field := s.Spec.ClusterIPs, "spec.clusterIPs"
	if len(ips) == 0 {
		ips, field = []string{s.Spec.ClusterIP}, "spec.clusterIP"
	}
	if s.Spec.ClusterIP != "" && len(s.Spec.ClusterIPs) > 0 && s.Spec.ClusterIP != s.Spec.ClusterIPs[0] {
		return fmt.Errorf("spec.clusterIP: %q is not spec.clusterIPs[0] %q", s.Spec.ClusterIP, s.Spec.ClusterIPs[0])
	}
	for i, ip := range ips {
		if ip == "" || ip == v1.ClusterIPNone && i == 0 {
			continue
		}
		f := field
		if field == "spec.clusterIPs" {
			f = fmt.Sprintf("%s[%d]", field, i)
		}
		if err := l.validClusterIP(f, ip); err != nil {
			return err
		}
	}
	return nil
}

func (l Limits) validNodePort(field string, p int32) error {
	if p == 0 {
		return nil
	}
	r := l.NodePorts
	if r == (PortRange{}) {
		r = DefaultNodePorts
	}
	if int(p) < r.Min || int(p) > r.Max {
		return fmt.Errorf("%s: %d is outside the node port range %s", field, p, r)
	}
	return validPort(field, p)
}

func (l Limits) validClusterIP(field, s string) error {
	a, err := netip.ParseAddr(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%s: %q is not an IP address", field, s)
	}
	a = a.Unmap()
	cidrs := l.ServiceCIDRs
	if len(cidrs) == 0 {
		cidrs = []netip.Prefix{DefaultServiceCIDR}
	}
	var names []string
	for _, p := range cidrs {
		if p.Contains(a) {
			// The range's own address and, for IPv4, its broadcast
			// address are never handed out.
			if a == p.Addr() || a.Is4() && a == lastAddr(p) {
				return fmt.Errorf("%s: %s is the network or broadcast address of the service range %s", field, a, p)
			}
			return nil
		}
		names = append(names, p.String())
	}
	return fmt.Errorf("%s: %s is not in the service range %s (--service-cluster-ip-range)", field, a, strings.Join(names, ","))
}

func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// ValidateV1EndpointSlice refuses slice ports outside 1-65535.
func ValidateV1EndpointSlice(e *discoveryv1.EndpointSlice) error {
	for i, p := range e.Ports {
		if p.Port != nil {
			if err := validPort(fmt.Sprintf("ports[%d].port", i), *p.Port); err != nil {
				return err
			}
		}
	}
	return nil
}
