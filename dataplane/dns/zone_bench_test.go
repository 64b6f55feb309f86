package dns

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/podnet/podnet/dataplane/cluster"
)

// zoneBenchState is 10,000 ClusterIP Services with two named ports and
// 1,000 headless Services with 5 endpoints each.
func zoneBenchState() *cluster.Store {
	st := cluster.NewStore()
	ports := []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}, {Name: "dns", Protocol: cluster.UDP, Port: 53}}
	for i := range 10000 {
		st.Upsert(&cluster.Service{Namespace: fmt.Sprintf("ns%d", i%100), Name: fmt.Sprintf("svc-%d", i), Type: cluster.ServiceTypeClusterIP,
			ClusterIPs: []netip.Addr{netip.AddrFrom4([4]byte{10, 97, byte(i / 250), byte(i%250 + 1)})}, Ports: ports})
	}
	for i := range 1000 {
		st.Upsert(&cluster.Service{Namespace: "hl", Name: fmt.Sprintf("hl-%d", i), Type: cluster.ServiceTypeClusterIP, Headless: true})
		st.Upsert(headlessSlice(i, 0))
	}
	st.MarkSynced()
	return st
}

func headlessSlice(i, gen int) *cluster.EndpointSlice {
	es := &cluster.EndpointSlice{Namespace: "hl", Name: fmt.Sprintf("hl-%d-x", i), ServiceName: fmt.Sprintf("hl-%d", i), AddressType: "IPv4",
		Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}}
	for j := range 5 {
		es.Endpoints = append(es.Endpoints, cluster.Endpoint{Ready: true,
			Addresses: []netip.Addr{netip.AddrFrom4([4]byte{10, 244, byte(i / 50), byte((i%50)*5 + j + gen%2)})}})
	}
	return es
}

// BenchmarkZoneBuild measures building the index: all of it from the
// store, and one headless Service's endpoints changing.
func BenchmarkZoneBuild(b *testing.B) {
	b.Run("full", func(b *testing.B) {
		st := zoneBenchState()
		b.ReportAllocs()
		for b.Loop() {
			NewZone(st, ZoneOptions{ShortNames: true}).Flush()
		}
	})
	b.Run("one-change", func(b *testing.B) {
		st := zoneBenchState()
		z := NewZone(st, ZoneOptions{ShortNames: true})
		z.Flush()
		b.ReportAllocs()
		for i := 0; b.Loop(); i++ {
			st.Upsert(headlessSlice(500, i+1))
			z.Flush()
		}
	})
}
