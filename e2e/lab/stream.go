package lab

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// streamChunk is what Stream writes at a time.
const streamChunk = 64 << 10

// Stream measures bulk TCP throughput against the echo servers at addrs:
// over one connection to each, it writes for d in all per address while a
// reader takes the echo back. The connections take turns of slice, as in
// RequestResponse, so the load of a shared machine falls on all of them
// alike: iperf3 runs one path at a time, and its rounds of one path
// seconds apart differ by up to 3.9× on a loaded box. A turn ends once all
// it wrote has come back, so every byte is counted in the turn that sent
// it, with the time it took to return. It returns the bytes per address
// and the time its turns took.
func Stream(ctx context.Context, addrs []string, d, slice time.Duration) ([]int64, []time.Duration, error) {
	var dialer net.Dialer
	conns := make([]net.Conn, len(addrs))
	echoed := make([]atomic.Int64, len(addrs))
	readErr := make(chan error, len(addrs))
	for i, addr := range addrs {
		c, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("stream %s: %w", addr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Duration(len(addrs))*d + 10*time.Second))
		r := bufio.NewReaderSize(c, streamChunk)
		if _, err := r.ReadString('\n'); err != nil { // the server's greeting
			return nil, nil, fmt.Errorf("stream %s: %w", addr, err)
		}
		conns[i] = c
		go func() {
			buf := make([]byte, streamChunk)
			for {
				n, err := r.Read(buf)
				echoed[i].Add(int64(n))
				if err != nil {
					readErr <- err
					return
				}
			}
		}()
	}
	n := make([]int64, len(addrs))
	took := make([]time.Duration, len(addrs))
	buf := make([]byte, streamChunk)
	for slices.ContainsFunc(took, func(t time.Duration) bool { return t < d }) {
		for i, c := range conns {
			if took[i] >= d {
				continue // a turn's drain can take one connection past d first
			}
			start := time.Now()
			for time.Since(start) < min(slice, d-took[i]) {
				if _, err := c.Write(buf); err != nil {
					return nil, nil, fmt.Errorf("stream %s: %w", addrs[i], err)
				}
				n[i] += streamChunk
			}
			for echoed[i].Load() < n[i] {
				select {
				case err := <-readErr:
					return nil, nil, fmt.Errorf("stream: read the echo: %w", err)
				case <-time.After(50 * time.Microsecond):
				}
			}
			took[i] += time.Since(start)
		}
	}
	return n, took, nil
}

// StreamRates runs `podnet-lab stream` (see Stream) from inside the pod,
// with a real process in the node's cgroup, against the echo servers at
// addrs for d each, in turns of slice, and returns the bits per second
// echoed back from each.
func (p *Pod) StreamRates(ctx context.Context, addrs []string, d, slice time.Duration) ([]float64, error) {
	out, err := p.Exec(ctx, append([]string{p.Node.lab.labBinary(), "stream", "--duration", d.String(), "--slice", slice.String()}, addrs...)...)
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, strings.TrimSpace(out))
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != len(addrs) {
		return nil, fmt.Errorf("podnet-lab stream: unexpected output %q", out)
	}
	rates := make([]float64, len(addrs))
	for i, line := range lines {
		var addr string
		var n int64
		var secs float64
		if _, err := fmt.Sscanf(line, "%s %d bytes in %fs", &addr, &n, &secs); err != nil || addr != addrs[i] || secs <= 0 {
			return nil, fmt.Errorf("podnet-lab stream: unexpected output %q", out)
		}
		rates[i] = float64(n) * 8 / secs
	}
	return rates, nil
}
