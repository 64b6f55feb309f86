package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// testCommand is a command with two subcommands and one flag that records
// what ran.
func testCommand(ran *[]string) Command {
	var level int
	sub := func(name string) Subcommand {
		return Subcommand{Name: name, Summary: "the " + name + " verb", Run: func(args []string, _, _ io.Writer) int {
			*ran = append(*ran, name+" "+strings.Join(args, " "))
			return ExitOK
		}}
	}
	return Command{
		Name: "tool", Summary: "a test tool",
		Subcommands: []Subcommand{sub("status"), sub("init")},
		Flags:       func(fs *pflag.FlagSet) { fs.IntVar(&level, "level", 1, "how much") },
		Run:         func(_, _ io.Writer) int { *ran = append(*ran, "daemon"); return ExitOK },
	}
}

func TestCommandLine(t *testing.T) {
	for _, c := range []struct {
		args    []string
		code    int
		ran     string
		stdout  []string
		stderr  []string
		noOther bool // the other stream is empty
	}{
		{args: nil, ran: "daemon"},
		{args: []string{"--level", "3"}, ran: "daemon"},
		{args: []string{"status", "-o", "json"}, ran: "status -o json"},
		// A typo of a subcommand never starts the command.
		{args: []string{"stauts"}, code: ExitUsage, stderr: []string{`unknown command "stauts"`, "status, init"}},
		{args: []string{"--level", "2", "extra"}, code: ExitUsage, stderr: []string{`unknown command "extra"`}},
		{args: []string{"--level", "2", "status"}, code: ExitUsage, stderr: []string{`"status" is a subcommand and goes first: tool status [flags]`}},
		{args: []string{"--bogus"}, code: ExitUsage, stderr: []string{"--bogus", "see tool --help"}},
		{args: []string{"--help"}, stdout: []string{"a test tool", "tool status [flags]", "the init verb", "--level"}, noOther: true},
		{args: []string{"-h"}, stdout: []string{"Subcommands:", "--level"}, noOther: true},
	} {
		var ran []string
		var out, errOut strings.Builder
		code := testCommand(&ran).Main(c.args, &out, &errOut)
		if code != c.code || strings.Join(ran, ";") != c.ran {
			t.Errorf("tool %q: exit %d, ran %q; want %d, %q (stderr %q)", c.args, code, ran, c.code, c.ran, errOut.String())
		}
		for _, want := range c.stdout {
			if !strings.Contains(out.String(), want) {
				t.Errorf("tool %q: stdout lacks %q:\n%s", c.args, want, out.String())
			}
		}
		for _, want := range c.stderr {
			if !strings.Contains(errOut.String(), want) {
				t.Errorf("tool %q: stderr lacks %q: %q", c.args, want, errOut.String())
			}
		}
		if c.noOther && errOut.Len() > 0 {
			t.Errorf("tool %q: stderr %q, want nothing", c.args, errOut.String())
		}
	}
}

func TestSubcommandFlags(t *testing.T) {
	parse := func(args ...string) (int, bool, string, string) {
		fs := pflag.NewFlagSet("tool status", pflag.ContinueOnError)
		fs.String("addr", "", "where")
		var out, errOut strings.Builder
		code, ok := SubcommandFlags(fs, "usage: tool status [flags]", args, &out, &errOut)
		return code, ok, out.String(), errOut.String()
	}
	if code, ok, _, errOut := parse("--addr", "x"); !ok || code != ExitOK || errOut != "" {
		t.Errorf("good flags: %d %v %q", code, ok, errOut)
	}
	if code, ok, _, errOut := parse("extra"); ok || code != ExitUsage || !strings.Contains(errOut, `unexpected argument "extra"`) {
		t.Errorf("stray argument: %d %v %q", code, ok, errOut)
	}
	if code, ok, out, errOut := parse("--help"); ok || code != ExitOK || !strings.Contains(out, "usage: tool status") || !strings.Contains(out, "--addr") || errOut != "" {
		t.Errorf("--help: %d %v stdout %q stderr %q", code, ok, out, errOut)
	}
}
