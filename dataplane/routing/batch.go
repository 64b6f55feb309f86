package routing

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"syscall"

	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/ipfamily"
)

// batchSocket writes many rtnetlink requests with one sendmsg and reads
// back only what failed. The kernel runs every request of a sendmsg in
// order before the call returns, and answers only those asking for an
// acknowledgement (the last of each batch) or failing; so 4,999 routes
// cost ~20 sendmsg calls and as many reads instead of 4,999 of each, with
// the library's per-request deadline and poller work. Each request still
// takes the RTNL lock on its own, so other namespaces' work interleaves
// with a batch as it would with single calls.
type batchSocket struct {
	s   *nl.NetlinkSocket
	seq uint32
	buf []byte
	rb  []byte
}

const (
	// batchBytes bounds one sendmsg (the socket's send buffer is ~200 KiB);
	// batchMsgs bounds the failures one batch can queue on the receive
	// buffer before it overflows (an error is one ~700-byte skb).
	batchBytes = 32 << 10
	batchMsgs  = 256
	// batchTimeout bounds the wait for a batch's acknowledgement, which
	// the kernel has queued before sendmsg returns unless RTNL waits.
	batchTimeout = 10_000 // ms
)

func newBatchSocket(ns netns.NsHandle) (*batchSocket, error) {
	s, err := nl.GetNetlinkSocketAt(ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("open netlink socket: %w", err)
	}
	fd := s.GetFd()
	// Errors without the request echoed back, and with the kernel's
	// reason in words; a larger receive buffer for a batch of failures.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	if unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 1<<20) != nil {
		_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUF, 1<<20)
	}
	return &batchSocket{s: s, rb: make([]byte, 64<<10)}, nil
}

func (b *batchSocket) Close() { b.s.Close() }

// request is one rtnetlink request: its type, flags and body (the message
// after the netlink header).
type request struct {
	typ   uint16
	flags uint16
	body  func([]byte) []byte
}

// do sends reqs in batches and returns the error of each that failed, by
// index, or nil when all succeeded.
func (b *batchSocket) do(n int, req func(i int) request) []error {
	var errs []error
	fail := func(i int, err error) {
		if errs == nil {
			errs = make([]error, n)
		}
		errs[i] = err
	}
	for start := 0; start < n; {
		b.buf = b.buf[:0]
		first := b.seq + 1
		last := 0 // offset of the last message's header
		end := start
		for end < n && end-start < batchMsgs && len(b.buf) < batchBytes {
			r := req(end)
			b.seq++
			last = len(b.buf)
			b.buf = binary.NativeEndian.AppendUint32(b.buf, 0)
			b.buf = binary.NativeEndian.AppendUint16(b.buf, r.typ)
			b.buf = binary.NativeEndian.AppendUint16(b.buf, unix.NLM_F_REQUEST|r.flags)
			b.buf = binary.NativeEndian.AppendUint32(b.buf, b.seq)
			b.buf = binary.NativeEndian.AppendUint32(b.buf, 0)
			b.buf = r.body(b.buf)
			binary.NativeEndian.PutUint32(b.buf[last:], uint32(len(b.buf)-last))
			end++
		}
		// Only the last asks for an acknowledgement: when it comes, every
		// request before it has been answered (errors only).
		flags := binary.NativeEndian.Uint16(b.buf[last+6:])
		binary.NativeEndian.PutUint16(b.buf[last+6:], flags|unix.NLM_F_ACK)
		if err := b.exchange(first, func(seq uint32, err error) { fail(start+int(seq-first), err) }); err != nil {
			for i := start; i < end; i++ {
				if errs == nil || errs[i] == nil {
					fail(i, err)
				}
			}
		}
		start = end
	}
	return errs
}

// exchange sends the batch in b.buf (sequence numbers first to b.seq) and
// reads the answers until the last one's, calling failed for each error.
func (b *batchSocket) exchange(first uint32, failed func(seq uint32, err error)) error {
	fd := b.s.GetFd()
	if err := unix.Sendto(fd, b.buf, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return fmt.Errorf("send %d netlink requests: %w", b.seq-first+1, err)
	}
	for {
		n, _, err := unix.Recvfrom(fd, b.rb, 0)
		if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			if k, err := unix.Poll(pfd, batchTimeout); err == nil && k == 0 {
				return fmt.Errorf("no netlink answer within %d ms", batchTimeout)
			}
			continue
		}
		if err != nil {
			// ENOBUFS: answers were dropped, so which requests failed is
			// unknown.
			return fmt.Errorf("read netlink answers: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(b.rb[:n])
		if err != nil {
			return fmt.Errorf("parse netlink answer: %w", err)
		}
		for _, m := range msgs {
			seq := m.Header.Seq
			if m.Header.Type != unix.NLMSG_ERROR || seq < first || seq > b.seq || len(m.Data) < 4 {
				continue // an answer to an earlier batch that timed out
			}
			if errno := int32(binary.NativeEndian.Uint32(m.Data)); errno != 0 {
				failed(seq, ackError(m, syscall.Errno(-errno)))
			}
			if seq == b.seq {
				return nil
			}
		}
	}
}

// ackError adds the kernel's extended acknowledgement text, if any, to err.
func ackError(m syscall.NetlinkMessage, err error) error {
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 {
		return err
	}
	// The error code, the request's header (NETLINK_CAP_ACK: no body),
	// then attributes.
	attrs := m.Data[4:]
	if len(attrs) < unix.SizeofNlMsghdr {
		return err
	}
	if m.Header.Flags&unix.NLM_F_CAPPED == 0 {
		l := int(binary.NativeEndian.Uint32(attrs))
		if l > len(attrs) {
			return err
		}
		attrs = attrs[(l+3)&^3:]
	} else {
		attrs = attrs[unix.SizeofNlMsghdr:]
	}
	for len(attrs) >= 4 {
		l, typ := int(binary.NativeEndian.Uint16(attrs)), binary.NativeEndian.Uint16(attrs[2:])
		if l < 4 || l > len(attrs) {
			break
		}
		if typ == unix.NLMSGERR_ATTR_MSG {
			return fmt.Errorf("%w: %s", err, unix.ByteSliceToString(attrs[4:l]))
		}
		attrs = attrs[min((l+3)&^3, len(attrs)):]
	}
	return err
}

func appendAttr(b []byte, typ uint16, data ...byte) []byte {
	b = binary.NativeEndian.AppendUint16(b, uint16(4+len(data)))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

func appendAttrU32(b []byte, typ uint16, v uint32) []byte {
	return appendAttr(b, typ, binary.NativeEndian.AppendUint32(nil, v)...)
}

// af is the kernel's family byte for a.
func af(a netip.Addr) byte { return byte(ipfamily.Of(a).AF()) }

// routeRequest replaces (or deletes) r, a route of podnet's in the main
// table through the link index.
func routeRequest(r *Route, index int, del bool) request {
	if del {
		return request{typ: unix.RTM_DELROUTE, body: func(b []byte) []byte {
			b = append(b, af(r.Dst.Addr()), byte(r.Dst.Bits()), 0, 0, unix.RT_TABLE_MAIN, Protocol, unix.RT_SCOPE_NOWHERE, 0, 0, 0, 0, 0)
			return appendAttr(b, unix.RTA_DST, r.Dst.Addr().AsSlice()...)
		}}
	}
	return request{typ: unix.RTM_NEWROUTE, flags: unix.NLM_F_CREATE | unix.NLM_F_REPLACE, body: func(b []byte) []byte {
		var flags uint32
		if r.Onlink {
			flags = unix.RTNH_F_ONLINK
		}
		b = append(b, af(r.Dst.Addr()), byte(r.Dst.Bits()), 0, 0, unix.RT_TABLE_MAIN, Protocol, unix.RT_SCOPE_UNIVERSE, unix.RTN_UNICAST)
		b = binary.NativeEndian.AppendUint32(b, flags)
		b = appendAttr(b, unix.RTA_DST, r.Dst.Addr().AsSlice()...)
		b = appendAttr(b, unix.RTA_GATEWAY, r.Gw.AsSlice()...)
		return appendAttrU32(b, unix.RTA_OIF, uint32(index))
	}}
}

// ndmsg appends a neighbour message header.
func ndmsg(b []byte, family byte, index int, state uint16, flags byte) []byte {
	b = append(b, family, 0, 0, 0)
	b = binary.NativeEndian.AppendUint32(b, uint32(index))
	b = binary.NativeEndian.AppendUint16(b, state)
	return append(b, flags, 0)
}

// neighRequest sets (or deletes) a permanent neighbour entry.
func neighRequest(n *Neigh, index int, del bool) request {
	if del {
		return request{typ: unix.RTM_DELNEIGH, body: func(b []byte) []byte {
			b = ndmsg(b, af(n.IP), index, 0, 0)
			return appendAttr(b, unix.NDA_DST, n.IP.AsSlice()...)
		}}
	}
	return request{typ: unix.RTM_NEWNEIGH, flags: unix.NLM_F_CREATE | unix.NLM_F_REPLACE, body: func(b []byte) []byte {
		b = ndmsg(b, af(n.IP), index, unix.NUD_PERMANENT, 0)
		b = appendAttr(b, unix.NDA_DST, n.IP.AsSlice()...)
		return appendAttr(b, unix.NDA_LLADDR, n.MAC...)
	}}
}

// fdbRequest sets (or deletes) a permanent FDB entry of the device itself.
func fdbRequest(f *FDB, index int, del bool) request {
	typ, flags := uint16(unix.RTM_NEWNEIGH), uint16(unix.NLM_F_CREATE|unix.NLM_F_REPLACE)
	if del {
		typ, flags = unix.RTM_DELNEIGH, 0
	}
	return request{typ: typ, flags: flags, body: func(b []byte) []byte {
		b = ndmsg(b, unix.AF_BRIDGE, index, unix.NUD_PERMANENT, unix.NTF_SELF)
		b = appendAttr(b, unix.NDA_DST, f.Dst.AsSlice()...)
		return appendAttr(b, unix.NDA_LLADDR, f.MAC...)
	}}
}
