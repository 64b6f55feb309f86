package lab

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"time"
)

// A long-lived UDP client: `podnet-lab udp-ask HOST:PORT` runs in a pod
// and keeps one UDP socket connected to HOST:PORT from one source port, as
// Kubernetes' conntrack spec's client does. It sends one query per line it
// reads and answers with the echo server's name. A socket that fails (ebpf
// mode destroys one connected to an endpoint that is gone) is dialled again
// from the same source port, as an application seeing the error would.

// udpAskWait is how long one query waits for its answer.
const udpAskWait = 200 * time.Millisecond

// ServeUDPAsks asks addr once per line of in and writes to out "ok NAME"
// (the echo server's name), "silent" (no answer in time) or "redial
// MESSAGE" (the socket failed and was dialled again from its port). It
// returns at the end of in.
func ServeUDPAsks(in io.Reader, out io.Writer, addr string) error {
	conn, err := net.Dial("udp", addr)
	if err != nil {
		return fmt.Errorf("udp-ask: %w", err)
	}
	laddr := conn.LocalAddr().(*net.UDPAddr)
	defer func() { conn.Close() }()
	w := bufio.NewWriter(out)
	sc := bufio.NewScanner(in)
	buf := make([]byte, 512)
	for sc.Scan() {
		_, err := conn.Write([]byte("q\n"))
		if err == nil {
			conn.SetReadDeadline(time.Now().Add(udpAskWait))
			var n int
			if n, err = conn.Read(buf); err == nil {
				name, _, _ := strings.Cut(strings.TrimSpace(string(buf[:n])), " ")
				fmt.Fprintf(w, "ok %s\n", name)
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			fmt.Fprintln(w, "silent")
		default:
			conn.Close()
			var derr error
			if conn, derr = (&net.Dialer{LocalAddr: laddr}).Dial("udp", addr); derr != nil {
				return fmt.Errorf("udp-ask: dial again from %s after %v: %w", laddr, err, derr)
			}
			fmt.Fprintf(w, "redial %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("udp-ask: write answer: %w", err)
		}
	}
	return sc.Err()
}

// UDPAsker is a `podnet-lab udp-ask` process in a pod or the outside host
// (in its cgroup, so socket-level load balancing applies to it).
type UDPAsker struct{ lineProc }

// StartUDPAsker starts `podnet-lab udp-ask addr` in the pod.
func (p *Pod) StartUDPAsker(addr string) (*UDPAsker, error) {
	return startUDPAsker(p.Node.lab.labBinary(), p.NS, p.Node.Cgroup, addr)
}

// StartUDPAsker starts `podnet-lab udp-ask addr` on the node (or the
// outside host), in its host network.
func (n *Node) StartUDPAsker(addr string) (*UDPAsker, error) {
	return startUDPAsker(n.lab.labBinary(), n.NS, n.Cgroup, addr)
}

func startUDPAsker(bin, netns, cgroup, addr string) (*UDPAsker, error) {
	lp, err := startLineProc(netns, cgroup, netns, []string{bin, "udp-ask", addr})
	if err != nil {
		return nil, err
	}
	return &UDPAsker{lp}, nil
}

// Ask sends one query and returns the process's answer line: "ok NAME",
// "silent" or "redial MESSAGE".
func (a *UDPAsker) Ask() (string, error) {
	if _, err := fmt.Fprintln(a.in); err != nil {
		return "", fmt.Errorf("podnet-lab udp-ask: %w: %s", err, a.errs.String())
	}
	line, err := a.out.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("podnet-lab udp-ask: %w: %s", err, a.errs.String())
	}
	return strings.TrimSpace(line), nil
}

// Close ends the process (the end of its input) and waits for it.
func (a *UDPAsker) Close() error {
	_ = a.in.Close()
	if err := a.cmd.Wait(); err != nil {
		return fmt.Errorf("podnet-lab udp-ask: %w: %s", err, a.errs.String())
	}
	return nil
}
