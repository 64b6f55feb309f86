// Package nftmsg sizes what podnet sends to nftables through
// github.com/google/nftables so the kernel takes it whole: set elements in
// messages under 64 KiB each, and a socket whose send buffer holds a batch
// of a whole table. The proxy's nftables mode and the NetworkPolicy table
// both write sets of thousands of elements in one transaction, so both go
// through here.
//
// google/nftables v0.3.0 puts every element of one call into one netlink
// attribute, whose length is 16 bits: past 64 KiB (~900 elements of a
// verdict map, ~1,800 IPv6 addresses) the length wraps, the kernel reads the
// first elements and takes the rest for other attributes, and the
// transaction fails with ENOENT or, worse, succeeds with elements missing.
// Upstream split the lists after v0.3.0 (google/nftables#303), in no release
// yet.
package nftmsg

import (
	"github.com/google/nftables"
	"github.com/mdlayher/netlink"
)

// MaxElemBytes bounds the elements of one set-element message, well under
// the 64 KiB an attribute can hold.
const MaxElemBytes = 48 << 10

// SplitElements cuts elems into lists of at most MaxElemBytes each, keeping
// an interval's end (flagged IntervalEnd, right after its start) with its
// start.
func SplitElements(elems []nftables.SetElement) [][]nftables.SetElement {
	var out [][]nftables.SetElement
	start, size := 0, 0
	for i, e := range elems {
		// An upper bound of the element's encoding: its nests and
		// headers, key, data and chain name.
		n := 64 + len(e.Key) + len(e.KeyEnd) + len(e.Val)
		if e.VerdictData != nil {
			n += len(e.VerdictData.Chain)
		}
		if size+n > MaxElemBytes && i > start && !e.IntervalEnd {
			out = append(out, elems[start:i])
			start, size = i, 0
		}
		size += n
	}
	if start < len(elems) {
		out = append(out, elems[start:])
	}
	return out
}

// AddElements queues the addition of elems to s on c, in as many messages
// as SplitElements makes.
func AddElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	for _, part := range SplitElements(elems) {
		if err := c.SetAddElements(s, part); err != nil {
			return err
		}
	}
	return nil
}

// DeleteElements queues the deletion of elems from s on c, as AddElements
// does.
func DeleteElements(c *nftables.Conn, s *nftables.Set, elems []nftables.SetElement) error {
	for _, part := range SplitElements(elems) {
		if err := c.SetDeleteElements(s, part); err != nil {
			return err
		}
	}
	return nil
}

// SocketBuffer is the send and receive buffer asked for: a full sync is
// one batch, and the default (212,992 bytes here) refused the proxy's batch
// of 500 Services × 10 endpoints, and the policy table's of 5,000 peers,
// with EMSGSIZE. The kernel caps it at net.core.wmem_max.
const SocketBuffer = 64 << 20

// Buffers is the connection option that sizes the socket's buffers.
func Buffers() nftables.ConnOption {
	return nftables.WithSockOptions(func(c *netlink.Conn) error {
		if err := c.SetWriteBuffer(SocketBuffer); err != nil {
			return err
		}
		return c.SetReadBuffer(SocketBuffer)
	})
}
