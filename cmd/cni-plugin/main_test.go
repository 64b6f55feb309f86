package main

import (
	"strings"
	"testing"
)

// TestCommandLine: --help goes to stdout with the subcommands; a stray word
// or a bare run (no CNI_COMMAND) is a usage error naming what is wrong.
func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		args         []string
		code         int
		stdout, errs string
	}{
		{[]string{"--help"}, 0, "Subcommands:\n  install", ""},
		{[]string{"install", "--help"}, 0, "--cni-conf-dir", ""},
		{nil, 2, "", "no CNI_COMMAND and no subcommand"},
		{[]string{"instal"}, 2, "", `unknown command "instal": the subcommands are install`},
		{[]string{"install", "now"}, 2, "", `unexpected argument "now"`},
	} {
		var out, errOut strings.Builder
		code := command().Main(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errOut.String(), c.errs) || (c.errs == "" && errOut.Len() > 0) {
			t.Errorf("podnet %q: exit %d, stdout %q, stderr %q; want %d, %q, %q", c.args, code, out.String(), errOut.String(), c.code, c.stdout, c.errs)
		}
	}
}
