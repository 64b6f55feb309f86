package lab

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Lock-step connects: `podnet-lab connect ADDR...` runs in a pod and makes
// one TCP connect per line it reads, to the address that line names by
// index, and answers with how long the connect took. A benchmark drives
// the clients of several nodes this way, one connect at a time in turns, so
// the load of a shared machine falls on every node's path alike and a
// ratio of one connect against the next holds little of it.

// connectTimeout bounds one connect of ServeConnects.
const connectTimeout = 2 * time.Second

// ServeConnects reads one address index per line from in, connects to
// addrs[index] over TCP (IPv4), closes the connection with a reset (no
// TIME_WAIT, so a long run never runs out of source ports), and writes
// "ok NANOSECONDS" (from before the socket is made to connect's return) or
// "err MESSAGE" to out. It returns at the end of in.
func ServeConnects(in io.Reader, out io.Writer, addrs []string) error {
	w := bufio.NewWriter(out)
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		i, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
		if err != nil || i < 0 || i >= len(addrs) {
			fmt.Fprintf(w, "err bad index %q: want 0..%d\n", sc.Text(), len(addrs)-1)
		} else {
			start := time.Now()
			c, err := net.DialTimeout("tcp4", addrs[i], connectTimeout)
			took := time.Since(start)
			if err != nil {
				fmt.Fprintf(w, "err %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
			} else {
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
				fmt.Fprintf(w, "ok %d\n", took.Nanoseconds())
			}
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("connect: write answer: %w", err)
		}
	}
	return sc.Err()
}

// Connector is a `podnet-lab connect` process in a pod (in its node's
// cgroup, so socket-level load balancing applies to it): Connect asks it
// for one connect.
type Connector struct{ lineProc }

// lineProc is a podnet-lab helper process (connect, udp-ask) that the test
// speaks to a line at a time over its stdin and stdout.
type lineProc struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	errs *syncBuffer
}

// startLineProc starts args in netns and cgroup with its stdin and stdout
// piped; where names the place in errors.
func startLineProc(netns, cgroup, where string, args []string) (lineProc, error) {
	cmd, cg, err := command(context.Background(), netns, cgroup, args, false)
	if err != nil {
		return lineProc{}, err
	}
	defer cg.Close()
	lp := lineProc{cmd: cmd, errs: &syncBuffer{}}
	cmd.Stderr = lp.errs
	if lp.in, err = cmd.StdinPipe(); err != nil {
		return lineProc{}, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return lineProc{}, err
	}
	lp.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		return lineProc{}, fmt.Errorf("start %s in %s: %w", strings.Join(args, " "), where, err)
	}
	return lp, nil
}

// StartConnector starts `podnet-lab connect addrs...` in the pod, on the
// CPUs cpus names (taskset's list form, "" for any). Clients of several
// nodes on the same CPU meet the same caches and the same neighbours: the
// SYN, its answer and the connect's return run where the client runs.
// Close it when done; it also dies with the process that started it.
func (p *Pod) StartConnector(cpus string, addrs ...string) (*Connector, error) {
	args := append([]string{p.Node.lab.labBinary(), "connect"}, addrs...)
	if cpus != "" {
		args = append([]string{"taskset", "-c", cpus}, args...)
	}
	lp, err := startLineProc(p.NS, p.Node.Cgroup, p.Name, args)
	if err != nil {
		return nil, err
	}
	return &Connector{lp}, nil
}

// Connect makes the process connect once to its i-th address and returns
// how long the connect took, as the process timed it.
func (c *Connector) Connect(i int) (time.Duration, error) {
	if _, err := fmt.Fprintf(c.in, "%d\n", i); err != nil {
		return 0, fmt.Errorf("podnet-lab connect: %w: %s", err, c.errs.String())
	}
	line, err := c.out.ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("podnet-lab connect: %w: %s", err, c.errs.String())
	}
	line = strings.TrimSpace(line)
	if rest, ok := strings.CutPrefix(line, "ok "); ok {
		ns, err := strconv.ParseInt(rest, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("podnet-lab connect: unexpected answer %q", line)
		}
		return time.Duration(ns), nil
	}
	return 0, errors.New("podnet-lab connect: " + line)
}

// Close ends the process (the end of its input) and waits for it.
func (c *Connector) Close() error {
	_ = c.in.Close()
	if err := c.cmd.Wait(); err != nil {
		return fmt.Errorf("podnet-lab connect: %w: %s", err, c.errs.String())
	}
	return nil
}
