// Package cli is the command line of podnet's binaries: subcommands as
// the first word, flags after, --help on stdout listing both, and no
// positional argument taken silently: a word that is neither a subcommand
// nor a flag is an error naming it, never a start with the word ignored.
package cli

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/version"
)

// Subcommand is a verb a binary takes as its first argument, before its
// own flags: `proxyd status -o json`.
type Subcommand struct {
	Name    string
	Summary string // one line, for --help
	// Run runs the subcommand on the arguments after its name and
	// returns the exit code.
	Run func(args []string, stdout, stderr io.Writer) int
}

// Command is a binary's command line: its subcommands, and its own flags
// when no subcommand is named. It takes no positional arguments: a word
// that is not a subcommand is an error naming it, never a start with the
// word ignored (`proxyd stauts` must not program the node).
type Command struct {
	Name    string // "proxyd"
	Summary string // what the binary is, for --help
	// Usage, when set, is the line after "Usage:" for the command itself
	// (default "NAME [flags]").
	Usage       string
	Subcommands []Subcommand
	// Flags registers the command's own flags.
	Flags func(*pflag.FlagSet)
	// Run runs the command once its flags are parsed and returns the exit
	// code.
	Run func(stdout, stderr io.Writer) int
}

// Exit codes.
const (
	ExitOK    = 0
	ExitError = 1 // the command failed
	ExitUsage = 2 // the command line is wrong
)

// Main runs the subcommand args name, else the command itself, and
// returns the exit code. --help writes to stdout and exits 0; every error
// goes to stderr.
func (c Command) Main(args []string, stdout, stderr io.Writer) int {
	if len(args) > 0 {
		if sc, ok := c.subcommand(args[0]); ok {
			return sc.Run(args[1:], stdout, stderr)
		}
	}
	fs := pflag.NewFlagSet(c.Name, pflag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.SortFlags = false
	if c.Flags != nil {
		c.Flags(fs)
	}
	fs.Usage = func() { c.printUsage(stdout, fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK
		}
		fmt.Fprintf(stderr, "%s: %v (see %s --help)\n", c.Name, err, c.Name)
		return ExitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: %v\n", c.Name, c.strayArgument(fs.Arg(0)))
		return ExitUsage
	}
	return c.Run(stdout, stderr)
}

func (c Command) subcommand(name string) (Subcommand, bool) {
	i := slices.IndexFunc(c.Subcommands, func(sc Subcommand) bool { return sc.Name == name })
	if i < 0 {
		return Subcommand{}, false
	}
	return c.Subcommands[i], true
}

// strayArgument says what is wrong with a positional argument.
func (c Command) strayArgument(arg string) error {
	if _, ok := c.subcommand(arg); ok {
		return fmt.Errorf("%q is a subcommand and goes first: %s %s [flags]", arg, c.Name, arg)
	}
	if len(c.Subcommands) == 0 {
		return fmt.Errorf("unexpected argument %q: %s takes flags only (see %s --help)", arg, c.Name, c.Name)
	}
	names := make([]string, len(c.Subcommands))
	for i, sc := range c.Subcommands {
		names[i] = sc.Name
	}
	return fmt.Errorf("unknown command %q: the subcommands are %s, anything else is a flag (see %s --help)",
		arg, strings.Join(names, ", "), c.Name)
}

func (c Command) printUsage(w io.Writer, fs *pflag.FlagSet) {
	fmt.Fprintf(w, "%s %s: %s\n\nUsage:\n", c.Name, version.String(), c.Summary)
	usage := c.Usage
	if usage == "" {
		usage = c.Name + " [flags]"
	}
	fmt.Fprintf(w, "  %s\n", usage)
	for _, sc := range c.Subcommands {
		fmt.Fprintf(w, "  %s %s [flags]\n", c.Name, sc.Name)
	}
	if len(c.Subcommands) > 0 {
		fmt.Fprintln(w, "\nSubcommands:")
		width := 0
		for _, sc := range c.Subcommands {
			width = max(width, len(sc.Name))
		}
		for _, sc := range c.Subcommands {
			fmt.Fprintf(w, "  %-*s  %s\n", width, sc.Name, sc.Summary)
		}
		fmt.Fprintf(w, "\n\"%s SUBCOMMAND --help\" lists a subcommand's flags.\n", c.Name)
	}
	fmt.Fprintln(w, "\nFlags:")
	fs.SetOutput(w)
	fs.PrintDefaults()
}

// SubcommandFlags parses a subcommand's flags the way Main parses the
// command's: --help to stdout (exit 0), errors and stray arguments to
// stderr (exit 2). With ok false the subcommand is over and exits with
// code.
func SubcommandFlags(fs *pflag.FlagSet, usage string, args []string, stdout, stderr io.Writer) (code int, ok bool) {
	name := fs.Name()
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stdout, usage)
		if fs.HasFlags() {
			fmt.Fprintln(stdout, "\nFlags:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return ExitOK, false
		}
		fmt.Fprintf(stderr, "%s: %v (see %s --help)\n", name, err, name)
		return ExitUsage, false
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected argument %q (see %s --help)\n", name, fs.Arg(0), name)
		return ExitUsage, false
	}
	return ExitOK, true
}
