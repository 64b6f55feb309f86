package dns

import (
	"encoding/binary"
	"net"
	"net/netip"
	"strconv"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// udpReader receives datagrams for serveUDP through the socket's raw file
// descriptor, so it knows when none is waiting: it calls idle then, once,
// before the runtime parks the worker until the socket is readable. A
// worker's metrics are added to the totals at that moment (queryStats), not
// after every query. The system calls are made directly because x/sys's
// wrappers allocate the source address on every datagram; this allocates
// nothing per datagram but a zone for link-local IPv6 sources.
type udpReader struct {
	rc  syscall.RawConn
	buf []byte
	oob []byte // control messages; nil: recvfrom, which copies less
	// What the last attempt got.
	sa     unix.RawSockaddrAny
	salen  uint32
	iov    unix.Iovec
	msg    unix.Msghdr
	n      int
	oobn   int
	errno  syscall.Errno
	waited bool
	idle   func()
	try    func(fd uintptr) bool // r.tryRecv, bound once
}

func newUDPReader(c *net.UDPConn, buf, oob []byte, idle func()) (*udpReader, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	r := &udpReader{rc: rc, buf: buf, oob: oob, idle: idle}
	r.try = r.tryRecv
	return r, nil
}

// read waits for the next datagram and returns its length, the length of
// its control messages, its source, and whether the socket was empty when
// read was called.
func (r *udpReader) read() (n, oobn int, from netip.AddrPort, waited bool, err error) {
	r.waited = false
	if err := r.rc.Read(r.try); err != nil {
		return 0, 0, netip.AddrPort{}, r.waited, err
	}
	if r.errno != 0 {
		return 0, 0, netip.AddrPort{}, r.waited, r.errno
	}
	return r.n, r.oobn, r.source(), r.waited, nil
}

// tryRecv receives one datagram without blocking; false asks the runtime
// to wait until the socket is readable and call it again.
func (r *udpReader) tryRecv(fd uintptr) bool {
	for {
		r.salen = uint32(unsafe.Sizeof(r.sa))
		var n uintptr
		var errno syscall.Errno
		if r.oob == nil {
			n, _, errno = unix.Syscall6(unix.SYS_RECVFROM, fd, uintptr(unsafe.Pointer(&r.buf[0])), uintptr(len(r.buf)), 0,
				uintptr(unsafe.Pointer(&r.sa)), uintptr(unsafe.Pointer(&r.salen)))
		} else {
			r.iov.Base = &r.buf[0]
			r.iov.SetLen(len(r.buf))
			r.msg = unix.Msghdr{Name: (*byte)(unsafe.Pointer(&r.sa)), Namelen: r.salen, Iov: &r.iov, Iovlen: 1, Control: &r.oob[0]}
			r.msg.SetControllen(len(r.oob))
			n, _, errno = unix.Syscall(unix.SYS_RECVMSG, fd, uintptr(unsafe.Pointer(&r.msg)), 0)
			r.oobn = int(r.msg.Controllen)
		}
		switch errno {
		case unix.EINTR:
			continue
		case unix.EAGAIN:
			if !r.waited && r.idle != nil {
				r.idle()
			}
			r.waited = true
			return false
		}
		r.n, r.errno = int(n), errno
		return true
	}
}

// source is the last datagram's source address.
func (r *udpReader) source() netip.AddrPort {
	switch r.sa.Addr.Family {
	case unix.AF_INET:
		sa := (*unix.RawSockaddrInet4)(unsafe.Pointer(&r.sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		return netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	case unix.AF_INET6:
		sa := (*unix.RawSockaddrInet6)(unsafe.Pointer(&r.sa))
		port := binary.BigEndian.Uint16((*[2]byte)(unsafe.Pointer(&sa.Port))[:])
		a := netip.AddrFrom16(sa.Addr)
		if sa.Scope_id != 0 {
			// The net package takes a numeric zone as the interface index.
			a = a.WithZone(strconv.FormatUint(uint64(sa.Scope_id), 10))
		}
		return netip.AddrPortFrom(a, port)
	}
	return netip.AddrPort{}
}
