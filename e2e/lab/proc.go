package lab

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Proc is a background process of a node or pod. Its output (stdout and
// stderr together) is kept for failure messages. The lab kills it on Close;
// it also dies when the process that started it does.
type Proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
	err  error // set before done is closed
	// signalled is set when Stop or Close sent the signal that ended it.
	signalled atomic.Bool
}

// Output returns everything the process printed so far.
func (p *Proc) Output() string { return p.out.String() }

// Pid is the process id (of the command itself: `ip netns exec` execs it).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Wait waits until the process exits or ctx ends, and returns how it exited.
func (p *Proc) Wait(ctx context.Context) error {
	select {
	case <-p.done:
		return p.exitErr()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// stopTimeout is how long Stop waits after SIGTERM before SIGKILL.
const stopTimeout = 5 * time.Second

// Stop ends the process: SIGTERM, then SIGKILL after 5 s. It returns nil
// when the process exited 0 or died of the signal; otherwise an error: the
// exit status of a process that had already ended by itself (a crash the
// caller wants to hear about) or that failed while shutting down, or that it
// ignored SIGTERM.
func (p *Proc) Stop() error {
	select {
	case <-p.done:
		return p.exitErr()
	default:
	}
	p.signalled.Store(true)
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return p.exitErr()
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s: still running %v after SIGTERM, killed", p.name, stopTimeout)
	}
}

func (p *Proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	p.signalled.Store(true)
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(stopTimeout):
	}
}

// exitErr is how the process ended, as an error; dying of a signal the lab
// sent is no error.
func (p *Proc) exitErr() error {
	if p.err == nil {
		return nil
	}
	var ee *exec.ExitError
	if p.signalled.Load() && errors.As(p.err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return nil
		}
	}
	return fmt.Errorf("%s: %w", p.name, p.err)
}

func (p *Proc) state() string {
	select {
	case <-p.done:
		if p.err == nil {
			return "exited 0"
		}
		return p.err.Error()
	default:
		return "running"
	}
}

// command builds `ip netns exec NS args...` placed into cgroup at fork
// (clone3 CLONE_INTO_CGROUP), so not even its first instruction runs outside
// the node's cgroup. `ip netns exec` also mounts the namespace's own /sys,
// so tools inside see the namespace's interfaces.
func command(ctx context.Context, nsName, cgroup string, args []string, detached bool) (*exec.Cmd, *os.File, error) {
	if len(args) == 0 {
		return nil, nil, errors.New("no command")
	}
	cg, err := os.Open(cgroup)
	if err != nil {
		return nil, nil, fmt.Errorf("open cgroup: %w", err)
	}
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", nsName}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		UseCgroupFD: true,
		CgroupFD:    int(cg.Fd()),
	}
	if !detached {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	return cmd, cg, nil
}

// execIn runs args in the namespace and cgroup and returns the combined
// output; the error includes it.
func execIn(ctx context.Context, nsName, cgroup string, args []string) (string, error) {
	cmd, cg, err := command(ctx, nsName, cgroup, args, false)
	if err != nil {
		return "", err
	}
	defer cg.Close()
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s (in %s): %w: %s", strings.Join(args, " "), nsName, err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// startIn starts args in the background in the namespace and cgroup.
func (l *Lab) startIn(name, nsName, cgroup string, args []string) (*Proc, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, errors.New("start " + name + ": lab is closed")
	}
	cmd, cg, err := command(context.Background(), nsName, cgroup, args, l.detached)
	if err != nil {
		return nil, err
	}
	defer cg.Close()
	p := &Proc{name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	l.procs = append(l.procs, p)
	return p, nil
}

// Exec runs a command in the node's namespace and cgroup and returns its
// output (stdout and stderr); on failure the error includes the output.
func (n *Node) Exec(ctx context.Context, args ...string) (string, error) {
	return execIn(ctx, n.NS, n.Cgroup, args)
}

// Start runs a command in the background in the node's namespace and cgroup.
// name labels it in logs.
func (n *Node) Start(name string, args ...string) (*Proc, error) {
	return n.lab.startIn(n.Name+"/"+name, n.NS, n.Cgroup, args)
}

// maxOutput bounds the output kept per process: a daemon logging for the
// length of a test must not grow without end. The newest half is kept.
const maxOutput = 4 << 20

type syncBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	dropped bool
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.buf.Len()+len(p) > maxOutput {
		keep := b.buf.Bytes()[max(0, b.buf.Len()-maxOutput/2):]
		keep = append([]byte(nil), keep...)
		b.buf.Reset()
		b.buf.Write(keep)
		b.dropped = true
	}
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.dropped {
		return "[older output dropped]\n" + b.buf.String()
	}
	return b.buf.String()
}
