// Package testport finds loopback ports for tests that start servers.
package testport

import (
	"fmt"
	"net"
	"testing"
)

// Free returns a loopback port free for both UDP and TCP right now (a port
// some connection still uses on its local side cannot be listened on).
func Free(t testing.TB) int {
	t.Helper()
	for range 100 {
		pc, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := pc.LocalAddr().(*net.UDPAddr).Port
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		pc.Close()
		if err == nil {
			l.Close()
			return port
		}
	}
	t.Fatal("no loopback port free for both UDP and TCP")
	return 0
}
