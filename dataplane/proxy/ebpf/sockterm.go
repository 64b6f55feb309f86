package ebpf

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf/link"
	"github.com/containernetworking/plugins/pkg/ns"
	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/bpf"
)

// Terminate destroys the connected UDP sockets that socket LB translated
// to a destination that left, in every network namespace of cgroup's
// processes (pods and the node), and returns how many namespaces it went
// through. A target names the backend and the frontend no longer sending
// to it, as Expire reads them: a zero frontend port is any frontend (the
// backend is gone), an invalid frontend address with a port a NodePort at
// any node address. Each owner gets an error on its next receive or send
// and can dial again.
func (d *Datapath) Terminate(targets []FlowTarget, cgroup string) (int, error) {
	if len(targets) == 0 {
		return 0, nil
	}
	term := d.term.Maps[bpf.SocktermMapTermV2]
	keys := make([]bpf.SocktermTermKey, 0, len(targets))
	for _, ft := range targets {
		k := termKey(ft)
		if !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	t := kernelTable[bpf.SocktermTermKey, uint8]{term}
	if err := t.Put(keys, slices.Repeat([]uint8{1}, len(keys))); err != nil {
		return 0, err
	}
	defer func() { _ = t.Delete(keys) }()
	nets, err := cgroupNetns(cgroup)
	if err != nil {
		return 0, err
	}
	prog := d.term.Programs[bpf.SocktermProgSockTermUdp]
	var errs []error
	for _, path := range nets {
		err := ns.WithNetNSPath(path, func(ns.NetNS) error {
			// The iterator walks the sockets of the namespace it is
			// created in.
			it, err := link.AttachIter(link.IterOptions{Program: prog})
			if err != nil {
				return err
			}
			defer it.Close()
			r, err := it.Open()
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = io.Copy(io.Discard, r)
			return err
		})
		// A process may have exited since it was listed.
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, fmt.Errorf("destroy sockets in %s: %w", path, err))
		}
	}
	return len(nets), errors.Join(errs...)
}

// termKey is ft as sockterm.c looks it up: the frontend in the form socket
// LB recorded it, or zeroed where ft holds any address or any frontend.
func termKey(ft FlowTarget) bpf.SocktermTermKey {
	k := bpf.SocktermTermKey{Backend: addr16(ft.Backend.Addr()), Bport: be16(ft.Backend.Port())}
	if ft.Frontend.Port() != 0 {
		k.Frontend, k.Fport = addr16(ft.Frontend.Addr()), be16(ft.Frontend.Port())
	}
	return k
}

// cgroupNetns lists one /proc/PID/task/TID/ns/net path per network
// namespace of the processes in cgroup and below.
func cgroupNetns(cgroup string) ([]string, error) {
	seen := make(map[uint64]bool)
	var out []string
	err := filepath.WalkDir(cgroup, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil // a cgroup removed under the walk
			}
			return err
		}
		if !e.IsDir() {
			return nil
		}
		f, err := os.Open(filepath.Join(path, "cgroup.procs"))
		if err != nil {
			return nil
		}
		defer f.Close()
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			pid, err := strconv.Atoi(strings.TrimSpace(sc.Text()))
			if err != nil {
				continue
			}
			// Every thread: one may have moved to a namespace of its own
			// (setns), and sockets it made live there.
			tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
			for _, task := range tasks {
				p := fmt.Sprintf("/proc/%d/task/%s/ns/net", pid, task.Name())
				var st unix.Stat_t
				if unix.Stat(p, &st) != nil || seen[st.Ino] {
					continue
				}
				seen[st.Ino] = true
				out = append(out, p)
			}
		}
		return nil
	})
	return out, err
}
