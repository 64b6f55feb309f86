package proxytest

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// TracePacket is a packet a mode's tracer follows through what the mode
// programmed for Scenario.
type TracePacket struct {
	Src, Dst netip.Addr
	Proto    string // tcp, udp, sctp
	DPort    uint16
	// FromHost is a packet the node itself sends, not one arriving.
	FromHost bool
}

// Traced is what a mode's tracer found for a packet.
type Traced struct {
	// Endpoints are the DNAT destinations ("IP:port") the packet may go to.
	Endpoints []string
	// Masquerade tells, per endpoint, whether the packet leaves with the
	// node's address as its source.
	Masquerade map[string]bool
	// Verdict is accept, drop or reject (any case).
	Verdict string
}

// TraceCase is one packet through Scenario and what every mode must do
// with it.
type TraceCase struct {
	Name   string
	Packet TracePacket
	// Endpoints are the endpoints the packet may reach, sorted.
	Endpoints []string
	// Masqueraded are the endpoints reached masqueraded, sorted.
	Masqueraded []string
	Verdict     string
}

// TraceCases are the semantics of Scenario as packets see them: the same
// for every proxy mode.
func TraceCases() []TraceCase {
	fromPod := func(dst string, proto string, port uint16) TracePacket {
		return TracePacket{Src: ClientPod, Dst: A(dst), Proto: proto, DPort: port}
	}
	local, remote := LocalPod.String(), RemotePod.String()
	return []TraceCase{
		{"clusterIP from a pod, both endpoints, source kept", fromPod("10.96.0.20", "tcp", 80),
			[]string{local + ":8080", remote + ":8080"}, nil, "accept"},
		{"second port of a multi-port Service", fromPod("10.96.0.20", "tcp", 443),
			[]string{local + ":8443", remote + ":8443"}, nil, "accept"},
		{"port not in the Service", fromPod("10.96.0.20", "tcp", 81), nil, nil, "accept"},
		{"UDP 53 and TCP 53 are two services: UDP", fromPod("10.96.0.10", "udp", 53), []string{remote + ":5353"}, nil, "accept"},
		{"UDP 53 and TCP 53 are two services: TCP", fromPod("10.96.0.10", "tcp", 53), []string{remote + ":5354"}, nil, "accept"},
		{"SCTP", fromPod("10.96.0.40", "sctp", 9000), []string{remote + ":9001"}, nil, "accept"},
		{"no endpoints: rejected", fromPod("10.96.0.30", "tcp", 80), nil, nil, "reject"},
		{"no endpoints, from the node: rejected",
			TracePacket{Src: NodeIP, Dst: A("10.96.0.30"), Proto: "tcp", DPort: 80, FromHost: true}, nil, nil, "reject"},
		{"NodePort without endpoints: rejected",
			TracePacket{Src: Outsider, Dst: NodeIP, Proto: "tcp", DPort: 30031}, nil, nil, "reject"},
		{"clusterIP from the node itself is masqueraded",
			TracePacket{Src: NodeIP, Dst: A("10.96.0.20"), Proto: "tcp", DPort: 80, FromHost: true},
			[]string{local + ":8080", remote + ":8080"}, []string{local + ":8080", remote + ":8080"}, "accept"},
		{"hairpin: an endpoint reaching itself is masqueraded, not when it lands elsewhere",
			TracePacket{Src: LocalPod, Dst: A("10.96.0.20"), Proto: "tcp", DPort: 80},
			[]string{local + ":8080", remote + ":8080"}, []string{local + ":8080"}, "accept"},
		{"NodePort from outside, policy Cluster: any endpoint, masqueraded",
			TracePacket{Src: Outsider, Dst: NodeIP, Proto: "tcp", DPort: 30080},
			[]string{local + ":8080", remote + ":8080"}, []string{local + ":8080", remote + ":8080"}, "accept"},
		{"externalIP from outside",
			TracePacket{Src: Outsider, Dst: A("192.168.10.200"), Proto: "tcp", DPort: 80},
			[]string{local + ":8080", remote + ":8080"}, []string{local + ":8080", remote + ":8080"}, "accept"},
		{"NodePort policy Local from outside: local endpoint only, source kept",
			TracePacket{Src: Outsider, Dst: NodeIP, Proto: "tcp", DPort: 30060},
			[]string{local + ":8080"}, nil, "accept"},
		{"NodePort policy Local from a pod: any endpoint",
			TracePacket{Src: ClientPod, Dst: NodeIP, Proto: "tcp", DPort: 30060},
			[]string{local + ":8080", remote + ":8080"}, nil, "accept"},
		{"NodePort policy Local from the node: any endpoint, masqueraded",
			TracePacket{Src: NodeIP, Dst: NodeIP, Proto: "tcp", DPort: 30060, FromHost: true},
			[]string{local + ":8080", remote + ":8080"}, []string{local + ":8080", remote + ":8080"}, "accept"},
		{"NodePort policy Local without a local endpoint: dropped",
			TracePacket{Src: Outsider, Dst: NodeIP, Proto: "tcp", DPort: 30070}, nil, nil, "drop"},
		{"load balancer IP from an allowed source range",
			TracePacket{Src: Outsider, Dst: A("192.168.30.1"), Proto: "tcp", DPort: 80},
			[]string{local + ":8080"}, nil, "accept"},
		{"load balancer IP from outside the source ranges: dropped",
			TracePacket{Src: A("192.168.40.1"), Dst: A("192.168.30.1"), Proto: "tcp", DPort: 80}, nil, nil, "drop"},
		{"NodePort on loopback is not a NodePort (it would need route_localnet)",
			TracePacket{Src: A("127.0.0.1"), Dst: A("127.0.0.1"), Proto: "tcp", DPort: 30080, FromHost: true}, nil, nil, "accept"},
		{"NodePort on a non-local address is not a NodePort",
			TracePacket{Src: Outsider, Dst: A("192.168.10.99"), Proto: "tcp", DPort: 30080}, nil, nil, "accept"},
		{"internalTrafficPolicy Local: local endpoint only", fromPod("10.96.0.80", "tcp", 80), []string{local + ":8080"}, nil, "accept"},
		{"internalTrafficPolicy Local without a local endpoint: dropped", fromPod("10.96.0.81", "tcp", 80), nil, nil, "drop"},
		{"Service of another proxy is left alone", fromPod("10.96.0.99", "tcp", 80), nil, nil, "accept"},
		{"session affinity keeps both endpoints reachable", fromPod("10.96.0.90", "tcp", 80),
			[]string{local + ":8080", remote + ":8080"}, nil, "accept"},
	}
}

// CheckTraces runs every TraceCase through a mode's tracer (of what the
// mode programmed for Scenario), as subtests.
func CheckTraces(t *testing.T, trace func(TracePacket) Traced) {
	for _, c := range TraceCases() {
		t.Run(c.Name, func(t *testing.T) {
			CheckTrace(t, trace(c.Packet), c.Endpoints, c.Masqueraded, c.Verdict)
		})
	}
}

// CheckTrace compares one traced packet with what it should meet.
func CheckTrace(t *testing.T, tr Traced, endpoints, masqueraded []string, verdict string) {
	t.Helper()
	if got := slices.Sorted(slices.Values(tr.Endpoints)); !slices.Equal(got, endpoints) {
		t.Errorf("endpoints = %v, want %v", got, endpoints)
	}
	if !strings.EqualFold(tr.Verdict, verdict) {
		t.Errorf("verdict = %s, want %s", tr.Verdict, verdict)
	}
	if !strings.EqualFold(tr.Verdict, "accept") {
		return
	}
	var masq []string
	for e := range maps.Keys(tr.Masquerade) {
		if tr.Masquerade[e] && e != "" {
			masq = append(masq, e)
		}
	}
	slices.Sort(masq)
	if !slices.Equal(masq, masqueraded) {
		t.Errorf("masqueraded to %v, want %v", masq, masqueraded)
	}
}
