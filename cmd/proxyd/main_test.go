package main

import (
	"testing"
)

// TestUnknownProxyModeRefused: a mode proxyd does not offer is a usage
// error at flag validation.
func TestUnknownProxyModeRefused(t *testing.T) {
	if code := run([]string{"--state-dir", t.TempDir(), "--proxy-mode", "nftables", "--healthz-bind-address", "", "--metrics-bind-address", ""}); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
}
