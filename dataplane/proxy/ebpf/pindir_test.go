package ebpf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/podnet/podnet/dataplane/roottest"
)

// mountOf finds the mount a pin dir is on and whether it propagates: the
// node's /sys/fs/bpf mounted Bidirectional into a pod is shared, a
// container's own /sys is not.
func TestMountOf(t *testing.T) {
	const pod = `1500 1400 0:90 / / rw,relatime master:1 - overlay overlay rw
1501 1500 0:91 / /sys ro,nosuid - sysfs sysfs ro
1502 1501 0:92 / /sys/fs/bpf rw,relatime shared:7 - bpf bpf rw
1503 1500 0:93 / /host/sys/fs/cgroup ro,relatime master:9 - cgroup2 cgroup2 rw
1504 1500 0:94 / /var/lib/my\040dir rw - tmpfs tmpfs rw
`
	for path, want := range map[string]struct {
		mp     string
		shared bool
	}{
		"/sys/fs/bpf/podnet":        {"/sys/fs/bpf", true},
		"/sys/fs/bpfother":          {"/sys", false},
		"/sys/fs/bpf":               {"/sys/fs/bpf", true},
		"/var/lib/my dir/pins":      {"/var/lib/my dir", false},
		"/run/podnet/bpf":           {"/", false},
		"/host/sys/fs/cgroup/x/../": {"/host/sys/fs/cgroup", false},
	} {
		if mp, shared := mountOf([]byte(pod), path); mp != want.mp || shared != want.shared {
			t.Errorf("%s: on %q shared %v; want %q %v", path, mp, shared, want.mp, want.shared)
		}
	}
	// A mount stacked on the same point later wins.
	stacked := pod + "1600 1502 0:95 / /sys/fs/bpf rw - bpf bpf rw\n"
	if mp, shared := mountOf([]byte(stacked), "/sys/fs/bpf/podnet"); mp != "/sys/fs/bpf" || shared {
		t.Errorf("stacked: %q %v; want the private one on top", mp, shared)
	}
}

// TestPinDirNotSharedRefused: in a mount namespace of proxyd's own, a pin
// dir not on a bpffs is refused with ErrPinDirNotShared and nothing is
// mounted, unless the mount holding it propagates (shared), as the node's
// /sys/fs/bpf mounted Bidirectional into a pod does.
func TestPinDirNotSharedRefused(t *testing.T) {
	roottest.Require(t)
	dir := t.TempDir()
	// PID 1's namespace as one that is not this test's (PID 1's may be
	// unreadable here, which counts as the host's).
	otherNS := filepath.Join(dir, "pid1-mnt")
	if err := os.Symlink("mnt:[1]", otherNS); err != nil {
		t.Fatal(err)
	}
	saved := nodeMountNS
	nodeMountNS = otherNS
	t.Cleanup(func() { nodeMountNS = saved })
	errc := make(chan error, 1)
	go func() {
		// This thread alone gets the new mount namespace; it is never
		// unlocked, so it ends with the goroutine and takes the
		// namespace (and every mount in it) along.
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			private := filepath.Join(dir, "private", "pins")
			err := ensureBPFFS(private)
			if !errors.Is(err, ErrPinDirNotShared) || !strings.Contains(err.Error(), private) {
				return fmt.Errorf("private: %v; want ErrPinDirNotShared naming %s", err, private)
			}
			if isMountPoint(private) {
				return fmt.Errorf("private: a bpffs was mounted on %s", private)
			}
			shared := filepath.Join(dir, "shared")
			os.MkdirAll(shared, 0o700)
			if err := unix.Mount("tmpfs", shared, "tmpfs", 0, ""); err != nil {
				return err
			}
			if err := unix.Mount("", shared, "", unix.MS_SHARED, ""); err != nil {
				return err
			}
			if err := ensureBPFFS(filepath.Join(shared, "pins")); err != nil {
				return fmt.Errorf("under a shared mount: %v", err)
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
