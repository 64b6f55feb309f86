package policy

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/cluster"
)

// The table's check chains log denied new connections to an nflog group,
// through a limit (Options.LogRate a second), and ListenDenied reads them
// back: the kernel does the rate limiting, and a denied packet costs the
// node nothing past the limit. nfnetlink_log's message and attribute
// numbers (linux/netfilter/nfnetlink_log.h; x/sys/unix has none of them).
const (
	nfulnlMsgPacket = 0
	nfulnlMsgConfig = 1

	nfulaPayload = 9
	nfulaPrefix  = 10

	nfulaCfgCmd     = 1
	nfulaCfgMode    = 2
	nfulaCfgQThresh = 5

	nfulnlCfgCmdBind = 1
	nfulnlCopyPacket = 2

	// deniedCopy is how much of a packet is copied: an IPv6 header and
	// the transport ports.
	deniedCopy = 64
)

// Denied is one denied new connection as the kernel logged it.
type Denied struct {
	// Direction is the base chain that dropped it: Egress for the
	// source's policies, Ingress for the destination's.
	Direction Direction
	Flow
}

// ListenDenied binds to the nflog group in the calling thread's network
// namespace and calls fn with each denied connection logged there, until
// ctx ends.
func ListenDenied(ctx context.Context, group uint16, fn func(Denied)) error {
	c, err := netlink.Dial(unix.NETLINK_NETFILTER, nil)
	if err != nil {
		return fmt.Errorf("nflog group %d: %w", group, err)
	}
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer func() {
		if stop() {
			c.Close()
		}
	}()
	ae := netlink.NewAttributeEncoder()
	ae.Bytes(nfulaCfgCmd, []byte{nfulnlCfgCmdBind})
	ae.Bytes(nfulaCfgMode, append(binary.BigEndian.AppendUint32(nil, deniedCopy), nfulnlCopyPacket, 0))
	// Each packet goes out at once, not with the next 99 or a second later.
	ae.Bytes(nfulaCfgQThresh, binary.BigEndian.AppendUint32(nil, 1))
	attrs, err := ae.Encode()
	if err != nil {
		return fmt.Errorf("nflog group %d: %w", group, err)
	}
	// The ack is read in the loop below: a packet logged right after
	// the bind may come before it.
	if _, err := c.Send(netlink.Message{
		Header: netlink.Header{Type: nflogType(nfulnlMsgConfig), Flags: netlink.Request | netlink.Acknowledge},
		Data:   append(nfgenmsg(unix.AF_UNSPEC, group), attrs...),
	}); err != nil {
		return fmt.Errorf("nflog group %d: bind: %w", group, err)
	}
	for {
		msgs, err := c.Receive()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("nflog group %d: %w", group, err)
		}
		for _, m := range msgs {
			if m.Header.Type != nflogType(nfulnlMsgPacket) {
				continue
			}
			if d, err := parseDenied(m.Data); err == nil {
				fn(d)
			}
		}
	}
}

func nflogType(msg int) netlink.HeaderType {
	return netlink.HeaderType(unix.NFNL_SUBSYS_ULOG<<8 | msg)
}

// nfgenmsg is nfnetlink's header: family, version, resource id (the group).
func nfgenmsg(family uint8, group uint16) []byte {
	return binary.BigEndian.AppendUint16([]byte{family, unix.NFNETLINK_V0}, group)
}

var errNotAFlow = errors.New("not an IPv4 or IPv6 packet with ports")

// parseDenied reads a logged packet: the prefix names the chain, the
// payload is the network header on.
func parseDenied(data []byte) (Denied, error) {
	if len(data) < 4 {
		return Denied{}, errNotAFlow
	}
	ad, err := netlink.NewAttributeDecoder(data[4:])
	if err != nil {
		return Denied{}, err
	}
	var d Denied
	var payload []byte
	for ad.Next() {
		switch ad.Type() {
		case nfulaPrefix:
			if ad.String() == dirNames[Egress] {
				d.Direction = Egress
			}
		case nfulaPayload:
			payload = ad.Bytes()
		}
	}
	if err := ad.Err(); err != nil {
		return Denied{}, err
	}
	d.Flow, err = parseFlow(payload)
	return d, err
}

// parseFlow reads addresses, protocol and destination port of an IPv4 or
// IPv6 packet (IPv6 extension headers are not followed).
func parseFlow(p []byte) (Flow, error) {
	var f Flow
	var proto byte
	var l4 []byte
	switch {
	case len(p) >= 20 && p[0]>>4 == 4:
		ihl := int(p[0]&0xf) * 4
		if len(p) < ihl+4 {
			return f, errNotAFlow
		}
		proto, l4 = p[9], p[ihl:]
		f.Src, f.Dst = netip.AddrFrom4([4]byte(p[12:16])), netip.AddrFrom4([4]byte(p[16:20]))
	case len(p) >= 44 && p[0]>>4 == 6:
		proto, l4 = p[6], p[40:]
		f.Src, f.Dst = netip.AddrFrom16([16]byte(p[8:24])), netip.AddrFrom16([16]byte(p[24:40]))
	default:
		return f, errNotAFlow
	}
	switch proto {
	case 6:
		f.Protocol = cluster.TCP
	case 17:
		f.Protocol = cluster.UDP
	case 132:
		f.Protocol = cluster.SCTP
	default:
		return f, errNotAFlow
	}
	f.Port = binary.BigEndian.Uint16(l4[2:4])
	return f, nil
}
