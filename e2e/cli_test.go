package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// commandBinary is one of podnet's commands under test: from PODNET_BIN (make test
// sets it to the binaries it has just built), else built from this tree.
func commandBinary(t *testing.T, name, pkg string) string {
	t.Helper()
	if dir := os.Getenv("PODNET_BIN"); dir != "" {
		return filepath.Join(dir, name)
	}
	bin := filepath.Join(t.TempDir(), name)
	build := exec.CommandContext(t.Context(), "go", "build", "-o", bin, pkg)
	build.Env = append(os.Environ(), "CGO_ENABLED=0") // as the Makefile builds them
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build %s: %v\n%s", name, err, out)
	}
	return bin
}

// TestCommandLine: each program prints its version, answers --help on
// stdout listing its subcommands, and refuses a bad flag or an unknown
// word with exit code 2 and a message naming it.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		name, pkg   string
		subcommands []string
	}{
		{"podnet", "../cmd/cni-plugin", []string{"install"}},
		{"proxyd", "../cmd/proxyd", []string{"status", "init"}},
		{"dnsd", "../cmd/dnsd", []string{"status"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			bin := commandBinary(t, c.name, c.pkg)

			out, err := exec.Command(bin, "--version").CombinedOutput()
			if err != nil || !strings.HasPrefix(string(out), c.name+" ") {
				t.Errorf("--version: %v, %q", err, out)
			}
			out, err = exec.Command(bin, "--help").Output()
			if err != nil || !strings.Contains(string(out), "--version") {
				t.Errorf("--help: %v, stdout %q", err, out)
			}
			for _, sc := range c.subcommands {
				if !strings.Contains(string(out), "\n  "+c.name+" "+sc+" [flags]") {
					t.Errorf("--help does not list the subcommand %s:\n%s", sc, out)
				}
			}
			out, err = exec.Command(bin, "stauts").CombinedOutput()
			if !errors.As(err, new(*exec.ExitError)) || err.(*exec.ExitError).ExitCode() != 2 || !strings.Contains(string(out), `"stauts"`) {
				t.Errorf("a typo of a subcommand: %v, %q; want exit code 2 naming it", err, out)
			}
			out, err = exec.Command(bin, "--no-such-flag").CombinedOutput()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() != 2 {
				t.Errorf("bad flag: want exit code 2, got %v", err)
			}
			if !strings.Contains(string(out), "--no-such-flag") {
				t.Errorf("bad flag: message does not name the flag: %q", out)
			}
		})
	}
}
