package lab

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
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

func TestServeUDPAsks(t *testing.T) {
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = serveUDP(pc, "s") }()
	// Two answers from one socket, then the server goes: the connected
	// socket hears the port unreachable (ECONNREFUSED) and dials again
	// from its port; with nothing listening, later asks are refused or
	// silent.
	in, inW := io.Pipe()
	outR, out := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- ServeUDPAsks(in, out, pc.LocalAddr().String()); out.Close() }()
	r := bufio.NewReader(outR)
	ask := func() string {
		t.Helper()
		fmt.Fprintln(inW)
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read answer: %v", err)
		}
		return strings.TrimSpace(line)
	}
	for range 2 {
		if got := ask(); got != "ok s" {
			t.Fatalf("answer %q, want ok s", got)
		}
	}
	pc.Close()
	var got []string
	for range 3 {
		got = append(got, ask())
	}
	if !slices.ContainsFunc(got, func(s string) bool { return strings.HasPrefix(s, "redial ") && strings.Contains(s, "refused") }) {
		t.Errorf("answers after the server went %q, want a redial after connection refused", got)
	}
	inW.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
