package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUnknownProxyModeRefused: a mode proxyd does not offer is a usage
// error at flag validation.
func TestUnknownProxyModeRefused(t *testing.T) {
	if code := run([]string{"--state-dir", t.TempDir(), "--proxy-mode", "nftables", "--healthz-bind-address", "", "--metrics-bind-address", ""}); code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
}

// TestEBPFModeRefusedBeforeAnythingIsTouched: ebpf mode on a cgroup that is
// not there is a usage error at flag validation, and no pin dir is made.
func TestEBPFModeRefusedBeforeAnythingIsTouched(t *testing.T) {
	pins := filepath.Join(t.TempDir(), "pins")
	code := run([]string{"--state-dir", t.TempDir(), "--proxy-mode", "ebpf", "--bpf-cgroup", filepath.Join(t.TempDir(), "no-such-cgroup"),
		"--bpf-pin-dir", pins, "--healthz-bind-address", "", "--metrics-bind-address", ""})
	if code != 2 {
		t.Errorf("exit code %d, want 2", code)
	}
	if _, err := os.Stat(pins); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("pin dir %s: %v; want it never created", pins, err)
	}
}

// TestInitUsage: proxyd init takes no arguments; --help (which the
// manifests test runs) exits 0 without touching the node.
func TestInitUsage(t *testing.T) {
	var out, errOut strings.Builder
	if code := runInit([]string{"extra"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), `"extra"`) {
		t.Errorf("proxyd init extra: exit %d, %q; want 2 naming the argument", code, errOut.String())
	}
	errOut.Reset()
	if code := runInit([]string{"--help"}, &out, &errOut); code != 0 || !strings.Contains(errOut.String(), "privileged init container") {
		t.Errorf("proxyd init --help: exit %d, %q", code, errOut.String())
	}
}

// The podCIDR claims go to the pod's namespace (the DaemonSet's downward
// API), else podnet's, where deploy/'s Role lets proxyd write Leases.
func TestClaimNamespaceDefault(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "")
	if got := claimNamespace(); got != "podnet-system" {
		t.Errorf("without POD_NAMESPACE: %q, want podnet-system", got)
	}
	t.Setenv("POD_NAMESPACE", "elsewhere")
	if got := claimNamespace(); got != "elsewhere" {
		t.Errorf("with POD_NAMESPACE=elsewhere: %q", got)
	}
	var f flags
	if err := f.flagSet().Parse(nil); err != nil || f.o.ClaimNamespace != "elsewhere" {
		t.Errorf("--claim-namespace default %q (%v), want $POD_NAMESPACE", f.o.ClaimNamespace, err)
	}
}
