package lab

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// netnsDir is where `ip netns` keeps named namespaces.
const netnsDir = "/run/netns"

func netnsPath(name string) string { return filepath.Join(netnsDir, name) }

// createNetns creates the named namespace with `ip netns add`, which also
// sets up /run/netns as a shared mount the way every other tool expects.
func createNetns(ctx context.Context, name string) error {
	out, err := exec.CommandContext(ctx, "ip", "netns", "add", name).CombinedOutput()
	if err != nil {
		return fmt.Errorf("create netns %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// deleteNetns removes the named namespace as `ip netns del` does (with its
// /etc/netns files); the kernel frees it once no process and no mount holds
// it. A missing one is no error.
func deleteNetns(name string) error {
	p := netnsPath(name)
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", name, err)
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", name, err)
	}
	return removeEtcNetns(name)
}

// listNetns returns the names of all named namespaces.
func listNetns() ([]string, error) {
	entries, err := os.ReadDir(netnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list netns: %w", err)
	}
	names := make([]string, 0, len(entries))
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names, nil
}

// etcNetnsDir holds per-namespace files that `ip netns exec` bind-mounts
// over their /etc counterparts, e.g. /etc/netns/NAME/resolv.conf.
const etcNetnsDir = "/etc/netns"

// setResolvConf gives processes started in the named namespace (through
// `ip netns exec`, as Exec and Start do) their own /etc/resolv.conf.
func setResolvConf(nsName, text string) error {
	dir := filepath.Join(etcNetnsDir, nsName)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("set resolv.conf of %s: %w", nsName, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "resolv.conf"), []byte(text), 0o644); err != nil {
		return fmt.Errorf("set resolv.conf of %s: %w", nsName, err)
	}
	return nil
}

// removeEtcNetns removes the per-namespace /etc files of the named namespace.
func removeEtcNetns(nsName string) error {
	if err := os.RemoveAll(filepath.Join(etcNetnsDir, nsName)); err != nil {
		return fmt.Errorf("remove %s: %w", filepath.Join(etcNetnsDir, nsName), err)
	}
	return nil
}
