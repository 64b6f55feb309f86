// Package roottest is the one place tests decide whether they can run on
// this machine: as root, with a tool installed, on a kernel with a feature.
// A test that cannot run here skips with the reason; under strict mode
// (PODNET_STRICT=1, which .ci/run sets) it fails instead, so CI's green
// says every test ran. Tests that need none of this never import the
// package.
package roottest

import (
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"
)

// StrictEnv is the environment variable that turns a missing root, tool or
// kernel feature from a skip into a failure when set to 1.
const StrictEnv = "PODNET_STRICT"

// Strict reports whether the run is strict: a test that cannot run here
// fails.
func Strict() bool { return os.Getenv(StrictEnv) == "1" }

// Require skips t with a reason (fails it under strict mode) unless the
// process runs as root.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root (creates network namespaces, links and iptables rules); run `make test` as root")
	}
}

// Tool returns the path of the command name, or skips t (fails it under
// strict mode) naming the Debian package that scripts/deps.sh installs for
// it.
func Tool(t testing.TB, name, debianPackage string) string {
	t.Helper()
	path, err := exec.LookPath(name)
	if err != nil {
		Unavailable(t, "%s not installed (scripts/deps.sh installs %s)", name, debianPackage)
	}
	return path
}

// Unavailable ends t because this machine lacks what it needs (root, a
// tool, a kernel feature): a skip with the reason, or under strict mode a
// failure with it.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatalf("cannot run here, and %s=1 forbids skipping: %s", StrictEnv, why)
	}
	t.Skip("skipped: " + why)
}

// Optional skips t because the run did not ask for it: a benchmark that
// runs only under its own switch (PODNET_BENCH), which `go test` without
// -bench never reaches, so make test neither runs nor counts it. It skips
// under strict mode too.
func Optional(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Skip("skipped: " + fmt.Sprintf(format, args...))
}

// NetNS creates a named network namespace of the test's own (prefix, the
// process and a counter make the name unique), removed when the test ends,
// and returns its name and an open handle. It requires root.
func NetNS(t testing.TB, prefix string) (string, ns.NetNS) {
	t.Helper()
	Require(t)
	name := fmt.Sprintf("%s-%d-%d", prefix, os.Getpid(), netnsSeq.Add(1))
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	h, err := ns.GetNS("/run/netns/" + name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close() })
	return name, h
}

var netnsSeq atomic.Int64
