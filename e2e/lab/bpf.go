package lab

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// BPFPinDir is where the node's proxyd pins its BPF maps and links in ebpf
// mode: a bpffs of the node's own, so several labs and the host's
// /sys/fs/bpf never share pins.
func (n *Node) BPFPinDir() string { return filepath.Join(n.Dir, "bpf") }

// BPFCgroup is the node's cgroup as the node's processes see it: `ip netns
// exec` gives them a /sys of the namespace's own, without the cgroup
// hierarchy, so the lab mounts cgroup2 once more in its work dir, which
// they do see.
func (n *Node) BPFCgroup() string {
	return filepath.Join(n.lab.WorkDir, "cgroup2", filepath.Base(n.Cgroup))
}

// mountBPF mounts the cgroup2 view and a bpffs on every node's pin dir, in
// this (the host's) mount namespace before any node process starts: a
// node's processes each get a copy of it, and a bpffs mounted by one of
// them would die with it, taking the pins along.
func (l *Lab) mountBPF() error {
	cg := filepath.Join(l.WorkDir, "cgroup2")
	if err := os.MkdirAll(cg, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", cg, err)
	}
	if err := unix.Mount("cgroup2", cg, "cgroup2", 0, ""); err != nil {
		return fmt.Errorf("mount cgroup2 on %s: %w", cg, err)
	}
	for _, n := range l.Nodes {
		dir := n.BPFPinDir()
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create %s: %w", dir, err)
		}
		if err := unix.Mount("bpffs", dir, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("mount bpffs on %s: %w", dir, err)
		}
	}
	return nil
}

// unmountUnder detaches every mount below dir (the nodes' bpffs pin dirs),
// so the work dir can be removed; unmounting a bpffs drops its pins.
func unmountUnder(dir string) error {
	f, err := os.Open("/proc/self/mounts")
	if err != nil {
		return fmt.Errorf("list mounts: %w", err)
	}
	defer f.Close()
	prefix := filepath.Clean(dir) + "/"
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 || !strings.HasPrefix(fields[1], prefix) {
			continue
		}
		if err := unix.Unmount(fields[1], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", fields[1], err))
		}
	}
	return errors.Join(errs...)
}

// cgroupMove serializes InCgroup: the whole process moves.
var cgroupMove sync.Mutex

// InCgroup runs fn with this process moved into cgroup, then moves it back.
// A socket belongs to the cgroup its creator was in, for life: a socket
// made in fn is treated as one of the node's (eBPF socket hooks attached to
// the node's cgroup see it) while the test keeps using it afterwards.
// Calls are serialized; fn must be short.
func InCgroup(cgroup string, fn func() error) error {
	cgroupMove.Lock()
	defer cgroupMove.Unlock()
	self, err := ownCgroup()
	if err != nil {
		return err
	}
	pid := []byte(fmt.Sprint(os.Getpid()))
	if err := os.WriteFile(filepath.Join(cgroup, "cgroup.procs"), pid, 0o644); err != nil {
		return fmt.Errorf("move into cgroup %s: %w", cgroup, err)
	}
	fnErr := fn()
	if err := os.WriteFile(filepath.Join(self, "cgroup.procs"), pid, 0o644); err != nil {
		return errors.Join(fnErr, fmt.Errorf("move back to cgroup %s: %w", self, err))
	}
	return fnErr
}

// ownCgroup is the cgroup v2 directory this process is in.
func ownCgroup() (string, error) {
	root, err := cgroup2Root()
	if err != nil {
		return "", err
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", fmt.Errorf("read own cgroup: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(root, rest), nil
		}
	}
	return "", errors.New("read own cgroup: no cgroup v2 entry in /proc/self/cgroup")
}
