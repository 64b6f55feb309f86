// Command echodns is the cheapest possible DNS responder: it sends every
// query back as an NXDOMAIN answer to itself, doing no lookup at all.
// scripts/bench-dns.sh runs it beside dnsd and CoreDNS to show the ceiling
// the machine, the kernel's loopback path and the load generator set for
// any UDP DNS server written in Go.
//
// Usage: echodns ADDR:PORT
package main

import (
	"fmt"
	"net"
	"os"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: echodns ADDR:PORT")
		os.Exit(2)
	}
	c, err := net.ListenPacket("udp", os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "echodns:", err)
		os.Exit(1)
	}
	conn := c.(*net.UDPConn)
	buf := make([]byte, 65535)
	for {
		n, from, err := conn.ReadFromUDPAddrPort(buf)
		if err != nil || n < 12 {
			continue
		}
		buf[2] |= 0x80             // QR: a response
		buf[3] = buf[3]&0xf0 | 0x3 // rcode NXDOMAIN
		conn.WriteToUDPAddrPort(buf[:n], from)
	}
}
