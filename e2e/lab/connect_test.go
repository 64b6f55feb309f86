package lab

import (
	"bytes"
	"net"
	"strings"
	"testing"
)

func TestServeConnects(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	// A port nothing listens on: bound, never listening.
	closed, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer closed.Close()
	refused := "127.0.0.1:" + strings.Split(closed.LocalAddr().String(), ":")[1]
	var out bytes.Buffer
	if err := ServeConnects(strings.NewReader("0\n1\n2\nx\n0\n"), &out, []string{ln.Addr().String(), refused}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	want := []string{"ok ", "err ", "err bad index", "err bad index", "ok "}
	if len(lines) != len(want) {
		t.Fatalf("answers = %q, want %d lines", lines, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(lines[i], w) {
			t.Errorf("answer %d = %q, want it to start with %q", i, lines[i], w)
		}
	}
	if !strings.Contains(lines[1], "refused") {
		t.Errorf("answer to the refused connect = %q, want connection refused", lines[1])
	}
}
