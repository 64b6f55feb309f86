package convert

import (
	"net/netip"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func TestValidateV1Service(t *testing.T) {
	l := Limits{ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12"), netip.MustParsePrefix("fd00:10:96::/112")}, NodePorts: PortRange{30000, 32767}}
	svc := func(mod func(*v1.ServiceSpec)) *v1.Service {
		s := &v1.Service{Spec: v1.ServiceSpec{ClusterIP: "10.96.0.10", ClusterIPs: []string{"10.96.0.10", "fd00:10:96::a"},
			Ports: []v1.ServicePort{{Port: 53, TargetPort: intstr.FromInt32(5353)}, {Port: 80, NodePort: 30080, TargetPort: intstr.FromString("http")}}}}
		if mod != nil {
			mod(&s.Spec)
		}
		return s
	}
	for _, tt := range []struct {
		name string
		mod  func(*v1.ServiceSpec)
		want string // "" valid, else a part of the error
	}{
		{"valid", nil, ""},
		{"headless", func(s *v1.ServiceSpec) { s.ClusterIP, s.ClusterIPs = "None", []string{"None"} }, ""},
		{"no cluster IP yet", func(s *v1.ServiceSpec) { s.ClusterIP, s.ClusterIPs = "", nil }, ""},
		{"port 70000", func(s *v1.ServiceSpec) { s.Ports[1].Port = 70000 }, "spec.ports[1].port: 70000 is not a port"},
		{"port 0", func(s *v1.ServiceSpec) { s.Ports[0].Port = 0 }, "spec.ports[0].port: 0"},
		{"targetPort 65536", func(s *v1.ServiceSpec) { s.Ports[0].TargetPort = intstr.FromInt32(65536) }, "spec.ports[0].targetPort: 65536"},
		{"nodePort 99999", func(s *v1.ServiceSpec) { s.Ports[1].NodePort = 99999 }, "spec.ports[1].nodePort: 99999 is outside the node port range 30000-32767"},
		{"nodePort 29999", func(s *v1.ServiceSpec) { s.Ports[1].NodePort = 29999 }, "nodePort: 29999"},
		{"healthCheckNodePort", func(s *v1.ServiceSpec) { s.HealthCheckNodePort = 80 }, "spec.healthCheckNodePort: 80"},
		{"cluster IP outside", func(s *v1.ServiceSpec) { s.ClusterIP, s.ClusterIPs = "8.8.8.8", []string{"8.8.8.8"} }, "spec.clusterIPs[0]: 8.8.8.8 is not in the service range 10.96.0.0/12,fd00:10:96::/112"},
		{"second family outside", func(s *v1.ServiceSpec) { s.ClusterIPs[1] = "fd00::1" }, "spec.clusterIPs[1]: fd00::1"},
		{"network address", func(s *v1.ServiceSpec) { s.ClusterIP, s.ClusterIPs = "10.96.0.0", nil }, "spec.clusterIP: 10.96.0.0 is the network or broadcast address"},
		{"broadcast address", func(s *v1.ServiceSpec) { s.ClusterIP, s.ClusterIPs = "10.111.255.255", nil }, "10.111.255.255 is the network or broadcast"},
		{"not an IP", func(s *v1.ServiceSpec) { s.ClusterIP, s.ClusterIPs = "10.96.0.999", nil }, `spec.clusterIP: "10.96.0.999" is not an IP address`},
		{"clusterIP differs from clusterIPs[0]", func(s *v1.ServiceSpec) { s.ClusterIP = "10.96.0.11" }, "spec.clusterIP"},
	} {
		err := ValidateV1Service(svc(tt.mod), l)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s: %v, want valid", tt.name, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s: %v, want an error containing %q", tt.name, err, tt.want)
		}
	}
	// The zero Limits are kube-apiserver's defaults.
	if err := ValidateV1Service(svc(nil), Limits{}); err == nil || !strings.Contains(err.Error(), "fd00:10:96::a") {
		t.Errorf("default limits accept an IPv6 cluster IP: %v", err)
	}
}

func TestParseLimitFlags(t *testing.T) {
	if got, err := ParseServiceCIDRs("10.96.0.0/12, fd00:10:96::/112"); err != nil || len(got) != 2 || got[1].String() != "fd00:10:96::/112" {
		t.Errorf("two families: %v, %v", got, err)
	}
	for _, bad := range []string{"", "10.96.0.0", "10.96.0.0/12,10.100.0.0/16"} {
		if _, err := ParseServiceCIDRs(bad); err == nil {
			t.Errorf("service CIDRs %q accepted", bad)
		}
	}
	for in, want := range map[string]PortRange{"30000-32767": {30000, 32767}, "20000+100": {20000, 20100}, "1-65535": {1, 65535}} {
		if got, err := ParsePortRange(in); err != nil || got != want {
			t.Errorf("port range %q: %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "30000", "0-100", "100-50", "30000-70000", "a-b"} {
		if _, err := ParsePortRange(bad); err == nil {
			t.Errorf("port range %q accepted", bad)
		}
	}
}
