package lab

import (
	"bytes"
	"net"
	"strings"
	"testing"
	"time"
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

func TestStreamTakesTurnsAndCountsEveryByte(t *testing.T) {
	var addrs []string
	for range 2 {
		ln, err := net.Listen("tcp4", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		go func() { _ = serveTCP(ln, "s") }()
		addrs = append(addrs, ln.Addr().String())
	}
	n, took, err := Stream(t.Context(), addrs, 200*time.Millisecond, 50*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	for i := range addrs {
		if n[i] <= 0 || n[i]%streamChunk != 0 {
			t.Errorf("%s: %d bytes, want a positive multiple of %d", addrs[i], n[i], streamChunk)
		}
		if took[i] < 200*time.Millisecond || took[i] > 5*time.Second {
			t.Errorf("%s: took %v, want at least the 200ms asked", addrs[i], took[i])
		}
	}
}
