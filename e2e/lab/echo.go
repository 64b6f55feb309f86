package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"
)

// The echo server and prober are what the lab runs in pods: `podnet-lab
// serve` and `podnet-lab probe` (the lab binary is built next to the others).
// Every answer is one line, "<server name> <client ip:port>", so a test sees
// which endpoint answered and which source address it saw (to check
// masquerading and client IP preservation).

// EchoOptions configure an echo server.
type EchoOptions struct {
	// Name is reported in every answer; it defaults to the pod's (or
	// node's) name.
	Name string
	// HTTP, TCP and UDP are listen addresses such as ":8080".
	HTTP, TCP, UDP []string
}

// Args are the `podnet-lab serve` arguments for o.
func (o EchoOptions) Args() []string {
	args := []string{"serve", "--name", o.Name}
	for _, a := range o.HTTP {
		args = append(args, "--http", a)
	}
	for _, a := range o.TCP {
		args = append(args, "--tcp", a)
	}
	for _, a := range o.UDP {
		args = append(args, "--udp", a)
	}
	return args
}

// EchoReady is the line ServeEcho's caller prints once every listener is
// bound.
const EchoReady = "podnet-lab serve: ready"

// ServeEcho answers on every listener of o until ctx ends. ready is called
// once all of them are bound.
func ServeEcho(ctx context.Context, o EchoOptions, ready func()) error {
	if len(o.HTTP)+len(o.TCP)+len(o.UDP) == 0 {
		return errors.New("serve: no listener (want --http, --tcp or --udp)")
	}
	var lc net.ListenConfig
	errc := make(chan error, len(o.HTTP)+len(o.TCP)+len(o.UDP))
	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	for _, addr := range o.HTTP {
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("serve http: %w", err)
		}
		srv := &http.Server{
			Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprintf(w, "%s %s\n", o.Name, r.RemoteAddr)
			}),
			ReadHeaderTimeout: 5 * time.Second,
		}
		closers = append(closers, srv)
		go func() { errc <- srv.Serve(ln) }()
	}
	for _, addr := range o.TCP {
		ln, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return fmt.Errorf("serve tcp: %w", err)
		}
		closers = append(closers, ln)
		go func() { errc <- serveTCP(ln, o.Name) }()
	}
	for _, addr := range o.UDP {
		pc, err := lc.ListenPacket(ctx, "udp", addr)
		if err != nil {
			return fmt.Errorf("serve udp: %w", err)
		}
		closers = append(closers, pc)
		go func() { errc <- serveUDP(pc, o.Name) }()
	}
	ready()
	select {
	case <-ctx.Done():
		return nil
	case err := <-errc:
		return err
	}
}

// serveTCP writes the answer line to every connection, then echoes what the
// client sends until it closes (so a test can also hold a connection open).
func serveTCP(ln net.Listener, name string) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return fmt.Errorf("serve tcp: %w", err)
		}
		go func() {
			defer c.Close()
			fmt.Fprintf(c, "%s %s\n", name, c.RemoteAddr())
			_, _ = io.Copy(c, c)
		}()
	}
}

func serveUDP(pc net.PacketConn, name string) error {
	buf := make([]byte, 64<<10)
	for {
		_, from, err := pc.ReadFrom(buf)
		if err != nil {
			return fmt.Errorf("serve udp: %w", err)
		}
		if _, err := pc.WriteTo([]byte(name+" "+from.String()+"\n"), from); err != nil {
			return fmt.Errorf("serve udp: %w", err)
		}
	}
}

// Probe asks the echo server at addr over proto ("http", "tcp" or "udp")
// and returns its answer line without the newline. UDP requests are resent
// every 200 ms until an answer or the timeout.
func Probe(ctx context.Context, proto, addr string, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	var d net.Dialer
	switch proto {
	case "http":
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/", nil)
		if err != nil {
			return "", err
		}
		// No keep-alive: each probe is a new connection, so a Service
		// picks an endpoint for each.
		client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}
		resp, err := client.Do(req)
		if err != nil {
			return "", fmt.Errorf("probe http %s: %w", addr, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if err != nil {
			return "", fmt.Errorf("probe http %s: %w", addr, err)
		}
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("probe http %s: %s", addr, resp.Status)
		}
		return strings.TrimSpace(string(body)), nil
	case "tcp":
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return "", fmt.Errorf("probe tcp %s: %w", addr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(deadline)
		line, err := bufio.NewReader(c).ReadString('\n')
		if err != nil {
			return "", fmt.Errorf("probe tcp %s: %w", addr, err)
		}
		return strings.TrimSpace(line), nil
	case "udp":
		c, err := d.DialContext(ctx, "udp", addr)
		if err != nil {
			return "", fmt.Errorf("probe udp %s: %w", addr, err)
		}
		defer c.Close()
		buf := make([]byte, 4096)
		for {
			if _, err := c.Write([]byte("probe\n")); err != nil {
				return "", fmt.Errorf("probe udp %s: %w", addr, err)
			}
			wait := time.Now().Add(200 * time.Millisecond)
			if wait.After(deadline) {
				wait = deadline
			}
			_ = c.SetReadDeadline(wait)
			n, err := c.Read(buf)
			if err == nil {
				return strings.TrimSpace(string(buf[:n])), nil
			}
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() || !time.Now().Before(deadline) {
				return "", fmt.Errorf("probe udp %s: %w", addr, err)
			}
		}
	default:
		return "", fmt.Errorf("probe: unknown protocol %q (want http, tcp or udp)", proto)
	}
}

// RequestResponse measures TCP_RR against the echo servers at addrs: over
// one connection to each, one byte out and its echo back, for d in all
// per address. The connections take turns of slice, so the load of a
// shared machine falls on all of them alike. It returns the round trips
// per address and the time they took.
func RequestResponse(ctx context.Context, addrs []string, d, slice time.Duration) ([]int, []time.Duration, error) {
	var dialer net.Dialer
	conns := make([]net.Conn, len(addrs))
	readers := make([]*bufio.Reader, len(addrs))
	for i, addr := range addrs {
		c, err := dialer.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("request/response %s: %w", addr, err)
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Duration(len(addrs))*d + 10*time.Second))
		conns[i], readers[i] = c, bufio.NewReader(c)
		if _, err := readers[i].ReadString('\n'); err != nil { // the server's greeting
			return nil, nil, fmt.Errorf("request/response %s: %w", addr, err)
		}
	}
	n := make([]int, len(addrs))
	took := make([]time.Duration, len(addrs))
	req := []byte{'x'}
	for took[len(addrs)-1] < d {
		for i, c := range conns {
			start := time.Now()
			for time.Since(start) < min(slice, d-took[i]) {
				if _, err := c.Write(req); err != nil {
					return nil, nil, fmt.Errorf("request/response %s: %w", addrs[i], err)
				}
				if _, err := readers[i].ReadByte(); err != nil {
					return nil, nil, fmt.Errorf("request/response %s: %w", addrs[i], err)
				}
				n[i]++
			}
			took[i] += time.Since(start)
		}
	}
	return n, took, nil
}
