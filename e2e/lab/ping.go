package lab

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
)

// ErrUnreachable is returned by Ping when an ICMP "destination unreachable"
// came back instead of a reply.
var ErrUnreachable = errors.New("destination unreachable")

// PingTimeout bounds one Ping when the context has no earlier deadline.
const PingTimeout = 2 * time.Second

// pingInterval spaces the echo requests of one Ping; with PingTimeout it
// bounds a Ping to 10 packets.
const pingInterval = 200 * time.Millisecond

// Ping sends ICMP echo requests from inside the namespace at nsPath to dst,
// one every 200 ms, until the first reply, and returns its round-trip time.
// It gives up after PingTimeout (or the context's deadline) or at the first
// ICMP error about its own packets. The machine has no ping binary; this
// needs none.
func Ping(ctx context.Context, nsPath string, dst netip.Addr) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, PingTimeout)
	defer cancel()
	var conn *icmp.PacketConn
	// A socket stays in the namespace it was created in.
	err := ns.WithNetNSPath(nsPath, func(ns.NetNS) error {
		var err error
		if dst.Is6() {
			conn, err = icmp.ListenPacket("ip6:ipv6-icmp", "::")
		} else {
			conn, err = icmp.ListenPacket("ip4:icmp", "0.0.0.0")
		}
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("ping %s: open icmp socket: %w", dst, err)
	}
	defer conn.Close()

	var idb [2]byte
	if _, err := rand.Read(idb[:]); err != nil {
		return 0, err
	}
	id := int(binary.BigEndian.Uint16(idb[:]))
	var sent sendTimes
	replies := make(chan pingReply, 1)
	go readReplies(conn, dst, id, &sent, replies)

	tick := time.NewTicker(pingInterval)
	defer tick.Stop()
	for seq := 1; ; seq++ {
		var typ icmp.Type = ipv4.ICMPTypeEcho
		if dst.Is6() {
			typ = ipv6.ICMPTypeEchoRequest
		}
		msg := icmp.Message{Type: typ, Body: &icmp.Echo{ID: id, Seq: seq, Data: []byte("podnet-lab ping")}}
		wb, err := msg.Marshal(nil)
		if err != nil {
			return 0, err
		}
		sent.set(seq, time.Now())
		if _, err := conn.WriteTo(wb, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return 0, fmt.Errorf("ping %s: %w", dst, err)
		}
		select {
		case r := <-replies:
			if r.err != nil {
				return 0, fmt.Errorf("ping %s: %w", dst, r.err)
			}
			return r.rtt, nil
		case <-ctx.Done():
			return 0, fmt.Errorf("ping %s: no reply to %d requests: %w", dst, seq, ctx.Err())
		case <-tick.C:
		}
	}
}

// pingReply is the first answer to a Ping: the round-trip time of an echo
// reply, or an error (an ICMP error quoting the Ping's request, or the
// socket's).
type pingReply struct {
	rtt time.Duration
	err error
}

// readReplies reads conn until it finds the first answer to the Ping
// with id to dst, sends it on replies and returns.
func readReplies(conn *icmp.PacketConn, dst netip.Addr, id int, sent *sendTimes, replies chan<- pingReply) {
	buf := make([]byte, 1500)
	for {
		n, from, err := conn.ReadFrom(buf)
		if err != nil {
			replies <- pingReply{err: err}
			return
		}
		got := time.Now()
		proto, reply := 1, icmp.Type(ipv4.ICMPTypeEchoReply)
		if dst.Is6() {
			proto, reply = 58, ipv6.ICMPTypeEchoReply
		}
		m, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil {
			continue
		}
		switch body := m.Body.(type) {
		case *icmp.Echo:
			// Raw sockets see every ICMP packet of the namespace: keep
			// only replies to this Ping.
			if m.Type != reply || body.ID != id || from.String() != dst.String() {
				continue
			}
			if t, ok := sent.get(body.Seq); ok {
				replies <- pingReply{rtt: got.Sub(t)}
				return
			}
		case *icmp.DstUnreach:
			if quotesEcho(body.Data, id) {
				replies <- pingReply{err: fmt.Errorf("%w (from %s, code %d)", ErrUnreachable, from, m.Code)}
				return
			}
		}
	}
}

// sendTimes remembers when each sequence number went out.
type sendTimes struct {
	mu sync.Mutex
	m  map[int]time.Time
}

func (s *sendTimes) set(seq int, t time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[int]time.Time{}
	}
	s.m[seq] = t
}

func (s *sendTimes) get(seq int) (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.m[seq]
	return t, ok
}

// quotesEcho reports whether the packet quoted in an ICMP error (IPv4 header
// plus the first 8 bytes of ICMP) is an echo request with the given id.
func quotesEcho(data []byte, id int) bool {
	if len(data) < 20 || data[0]>>4 != 4 {
		return false
	}
	ihl := int(data[0]&0x0f) * 4
	if data[9] != 1 || len(data) < ihl+8 {
		return false
	}
	icmpHdr := data[ihl:]
	return icmpHdr[0] == byte(ipv4.ICMPTypeEcho) && int(binary.BigEndian.Uint16(icmpHdr[4:6])) == id
}
