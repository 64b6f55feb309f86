package dns

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// TestWildcardListenRepliesFromQueriedAddress: a server on 0.0.0.0 answers
// each query from the address it was sent to, or a client that asked
// 127.0.0.2 would drop an answer coming from 127.0.0.1.
func TestWildcardListenRepliesFromQueriedAddress(t *testing.T) {
	check(t, "0.0.0.0:0", "127.0.0.1", "127.0.0.2", "127.0.0.3")
	if ln, err := net.ListenPacket("udp6", "[::1]:0"); err == nil {
		ln.Close()
		check(t, "[::]:0", "::1", "127.0.0.1")
	}
}

func check(t *testing.T, listen string, dsts ...string) {
	z := NewZone(testState(), ZoneOptions{ShortNames: true})
	z.Flush()
	srv := NewServer(ServerOptions{Listen: []string{listen}, Zone: z, Sockets: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan Listening, 1)
	go srv.Run(ctx, ready)
	l := <-ready
	for _, dst := range dsts {
		c := &mdns.Client{Net: "udp", Timeout: time.Second}
		q := new(mdns.Msg)
		q.SetQuestion("kubernetes.default.", mdns.TypeA)
		m, _, err := c.Exchange(q, net.JoinHostPort(dst, fmt.Sprint(l.UDP[0].Port())))
		if err != nil {
			t.Errorf("query to %s: %v", dst, err)
			continue
		}
		if len(m.Answer) != 1 {
			t.Errorf("query to %s: %v", dst, m)
		}
	}
}
