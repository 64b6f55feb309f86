package e2e

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/podnet/podnet/e2e/lab"
)

// crashChildEnv makes the test binary, re-executed by a test, build a lab
// and wait to be killed: a real crashed run for the stale-lab test.
const crashChildEnv = "PODNET_LAB_CRASH_CHILD"

func TestMain(m *testing.M) {
	if prefix := os.Getenv(crashChildEnv); prefix != "" {
		os.Exit(crashChild(prefix))
	}
	if arg := os.Getenv(kubeRSSChildEnv); arg != "" {
		os.Exit(kubeRSSChild(arg))
	}
	code := m.Run()
	closeControlPlane()
	for _, f := range cleanups {
		f()
	}
	os.Exit(code)
}

// crashChild builds a lab with the given prefix, starts a process and leaves
// another behind in a node's cgroup that outlives this one (as a daemon's
// child would), says "ready <started pid> <left pid>" and blocks until it is
// killed. It never closes the lab.
func crashChild(prefix string) int {
	ctx := context.Background()
	l, err := lab.New(ctx, lab.Options{Prefix: prefix})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// sh exits at once; the backgrounded sleep is reparented and lives on,
	// so only the sweep of the node's cgroup can end it.
	out, err := l.Nodes[0].Exec(ctx, "sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	// A process the lab started itself dies with this process.
	p, err := l.Nodes[1].Start("sleeper", "sleep", "300")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Printf("ready %d %s", p.Pid(), out)
	time.Sleep(10 * time.Minute) // bounded, in case the test forgot to kill it
	return 1
}
