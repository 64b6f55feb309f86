// Package roottest is the one place tests decide whether they can touch the
// kernel's network state. Tests that need root call Require; tests that don't
// never import this package.
package roottest

import (
	"os"
	"testing"
)

// Require skips t with a reason unless the process runs as root. CI runs as
// root, so these tests run there.
func Require(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipped: needs root (creates network namespaces, links and iptables rules); run `make test` as root")
	}
}
