package main

import (
	"strings"
	"testing"
)

// TestCommandLine: --help goes to stdout with the subcommands; a stray word
// is a usage error naming it, never a start.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"--help"}, 0, "Subcommands:\n  status", ""},
		{[]string{"--help"}, 0, "--upstream", ""},
		{[]string{"status", "--help"}, 0, "--metrics-address", ""},
		{[]string{"stauts"}, 2, "", `unknown command "stauts": the subcommands are status`},
		{[]string{"--state-dir", t.TempDir(), "--listen", "127.0.0.1:0", "serve"}, 2, "", `unknown command "serve"`},
	} {
		var out, errOut strings.Builder
		code := command().Main(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errOut.String(), c.errs) || (c.errs == "" && errOut.Len() > 0) {
			t.Errorf("dnsd %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, out.String(), errOut.String(), c.code, c.stdout, c.errs)
		}
	}
}
