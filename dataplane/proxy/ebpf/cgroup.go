package ebpf

import (
	"fmt"
	"path/filepath"
)

// hybridUnified is where a hybrid host (cgroup v1 controllers, v2 for
// process tracking) mounts its cgroup v2 hierarchy, below /sys/fs/cgroup.
const hybridUnified = "unified"

// ResolveCgroup turns a --bpf-cgroup value into the cgroup v2 directory the
// socket programs attach to. A cgroup v2 directory is taken as it is; a
// directory that is not one but holds the v2 hierarchy at unified/ (a
// hybrid host's /sys/fs/cgroup) means that one. So the one value a
// DaemonSet passes, the host's /sys/fs/cgroup as it mounts it, serves a
// node of either layout.
func ResolveCgroup(dir string) (string, error) {
	err := checkCgroup(dir)
	if err == nil {
		return dir, nil
	}
	unified := filepath.Join(dir, hybridUnified)
	if checkCgroup(unified) == nil {
		return unified, nil
	}
	return "", fmt.Errorf("%w, nor does it hold one at %s/ (a hybrid host's cgroup root)", err, hybridUnified)
}
