package dns

import (
	"fmt"
	"net/netip"
	"runtime"
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

// scaleBenchState is the state of make soak's scenario 6 as dnsd sees it:
// 10,000 ClusterIP Services with one port, in 100 namespaces, × 10 ready
// endpoints each (e2e/soak_scale_test.go writes the same).
func scaleBenchState() *cluster.Store {
	st := cluster.NewStore()
	v4 := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	const nodes, endpoints = 5000, 10
	for s := range 10000 {
		ns := fmt.Sprintf("ns-%02d", s%100)
		name := fmt.Sprintf("s%05d", s)
		st.Upsert(&cluster.Service{Namespace: ns, Name: name, Type: cluster.ServiceTypeClusterIP,
			ClusterIPs: []netip.Addr{v4(10<<24 | 96<<16 | 1<<8 + uint32(s))},
			Ports:      []cluster.ServicePort{{Name: "http", Protocol: cluster.TCP, Port: 80}}})
		sl := &cluster.EndpointSlice{Namespace: ns, Name: name + "-x", ServiceName: name, AddressType: "IPv4",
			Ports: []cluster.EndpointPort{{Name: "http", Protocol: cluster.TCP, Port: 8080}}}
		for j := range endpoints {
			k := s*endpoints + j
			sl.Endpoints = append(sl.Endpoints, cluster.Endpoint{Ready: true,
				Addresses: []netip.Addr{v4(10<<24 | 128<<16 + uint32(k%nodes)*256 + 2 + uint32(k/nodes))}})
		}
		st.Upsert(sl)
	}
	st.MarkSynced()
	return st
}

// BenchmarkZoneHeap builds the index of scaleBenchState and reports the
// live heap it holds ("index-MB": after a GC, less the store's) and the
// garbage its build made ("garbage-MB").
func BenchmarkZoneHeap(b *testing.B) {
	st := scaleBenchState()
	var ms runtime.MemStats
	for b.Loop() {
		runtime.GC()
		runtime.ReadMemStats(&ms)
		before, allocs := ms.HeapAlloc, ms.TotalAlloc
		z := NewZone(st, ZoneOptions{ShortNames: true})
		z.Flush()
		runtime.ReadMemStats(&ms)
		total := ms.TotalAlloc - allocs
		runtime.GC()
		runtime.ReadMemStats(&ms)
		index := ms.HeapAlloc - before
		b.ReportMetric(float64(index)/1e6, "index-MB")
		b.ReportMetric(float64(total-index)/1e6, "garbage-MB")
		runtime.KeepAlive(z)
	}
}
