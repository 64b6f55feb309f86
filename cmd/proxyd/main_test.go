package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// run runs proxyd's command line with its output discarded.
func run(args []string) int { return command().Main(args, io.Discard, io.Discard) }

// TestNoDaemonStartOnAStrayWord: a typo of a subcommand, or a word after
// the flags, is a usage error naming the word; proxyd never starts (it would
// write the node config and never return).
func TestNoDaemonStartOnAStrayWord(t *testing.T) {
	dir := t.TempDir()
	nodeConfig := filepath.Join(dir, "node.json")
	daemonFlags := []string{"--state-dir", dir, "--node-config", nodeConfig, "--proxy-mode", "none", "--healthz-bind-address", "", "--metrics-bind-address", ""}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"stauts"}, `unknown command "stauts": the subcommands are status, init`},
		{append(daemonFlags, "stauts"), `unknown command "stauts"`},
		{append(daemonFlags, "status"), `"status" is a subcommand and goes first`},
		{[]string{"init", "now"}, `unexpected argument "now"`},
		{[]string{"status", "json"}, `unexpected argument "json"`},
	} {
		var out, errOut strings.Builder
		if code := command().Main(c.args, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), c.want) {
			t.Errorf("proxyd %q: exit %d, stderr %q; want 2 and %q", c.args, code, errOut.String(), c.want)
		}
	}
	if _, err := os.Stat(nodeConfig); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("node config %s: %v; want it never written", nodeConfig, err)
	}
}

// TestHelp: --help goes to stdout, with the subcommands and the flags, and
// exits 0; each subcommand's --help too.
func TestHelp(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"Subcommands:", "status", "init", "--proxy-mode", "--version", "--log-format"}},
		{[]string{"status", "--help"}, []string{"usage: proxyd status", "--metrics-bind-address", "--bpf-pin-dir"}},
		{[]string{"init", "--help"}, []string{"usage: proxyd init", "privileged init container"}},
	} {
		var out, errOut strings.Builder
		code := command().Main(c.args, &out, &errOut)
		if code != 0 || errOut.Len() > 0 {
			t.Errorf("proxyd %q: exit %d, stderr %q; want 0 and nothing", c.args, code, errOut.String())
		}
		for _, w := range c.want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("proxyd %q: stdout lacks %q:\n%s", c.args, w, out.String())
			}
		}
	}
}

// TestUnknownProxyModeRefused: a mode proxyd does not offer is a usage
// error at flag validation.
func TestUnknownProxyModeRefused(t *testing.T) {
	if code := run([]string{"--state-dir", t.TempDir(), "--proxy-mode", "ipvs", "--healthz-bind-address", "", "--metrics-bind-address", ""}); code != 2 {
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
	fs := pflag.NewFlagSet("proxyd", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(nil); err != nil || f.o.ClaimNamespace != "elsewhere" {
		t.Errorf("--claim-namespace default %q (%v), want $POD_NAMESPACE", f.o.ClaimNamespace, err)
	}
}
