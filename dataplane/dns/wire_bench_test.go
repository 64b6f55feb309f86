package dns

import (
	"testing"

	mdns "github.com/miekg/dns"
)

// BenchmarkParse measures reading one query with EDNS (parseRequest).
func BenchmarkParse(b *testing.B) {
	q := new(mdns.Msg)
	q.SetQuestion("svc-4242.bench.svc.cluster.local.", mdns.TypeA)
	q.SetEdns0(1232, false)
	pkt, _ := q.Pack()
	var r request
	var lower [256]byte
	for b.Loop() {
		if err := parseRequest(pkt, lower[:], &r); err != nil {
			b.Fatal(err)
		}
	}
}
