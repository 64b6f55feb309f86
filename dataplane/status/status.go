// Package status collects what a daemon's parts report about themselves
// into one JSON document, served on the daemon's local metrics port at
// /status, for `proxyd status` and `dnsd status`: the running daemon says
// what it has programmed, rather than a tool guessing from kernel state.
package status

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/cli"
)

// Path is where a daemon serves its Board.
const Path = "/status"

// Board holds one report function per section. Safe for concurrent use.
type Board struct {
	mu       sync.Mutex
	sections map[string]func() any
}

// Provide registers the function that reports section name; it is called
// on every request and must be safe to call from any goroutine.
func (b *Board) Provide(name string, report func() any) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.sections == nil {
		b.sections = make(map[string]func() any)
	}
	b.sections[name] = report
}

// Report returns every section's current report.
func (b *Board) Report() map[string]any {
	b.mu.Lock()
	names := make([]string, 0, len(b.sections))
	for n := range b.sections {
		names = append(names, n)
	}
	fns := make(map[string]func() any, len(b.sections))
	for n, f := range b.sections {
		fns[n] = f
	}
	b.mu.Unlock()
	slices.Sort(names)
	out := make(map[string]any, len(names))
	for _, n := range names {
		out[n] = fns[n]()
	}
	return out
}

// ServeHTTP answers the report as one JSON object, by section.
func (b *Board) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(b.Report())
}

// Fetch GETs the Board of the daemon whose metrics port is addr
// (host:port) and decodes it into out.
func Fetch(addr string, out any) error {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + Path)
	if err != nil {
		return fmt.Errorf("ask the daemon at %s (is it running, is that its metrics address?): %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("GET %s%s: %s %s", addr, Path, resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode the status of %s: %w", addr, err)
	}
	return nil
}

// Command is what a `status` subcommand's flags ask for.
type Command struct {
	Name string // "proxyd status", for messages
	Addr string // the daemon's metrics address
	JSON bool   // -o json
	// stderr is where Fetch reports a failure.
	stderr io.Writer
}

// ParseCommand parses a status subcommand's flags: addrFlag (the daemon's
// metrics address, defaultAddr if not given), -o text|json and whatever
// more flags register adds. --help goes to stdout, errors to stderr. With
// ok false the command is over and exits with code (usage printed or
// refused).
func ParseCommand(name, addrFlag, defaultAddr string, args []string, stdout, stderr io.Writer, register ...func(*pflag.FlagSet)) (c Command, code int, ok bool) {
	fs := pflag.NewFlagSet(name, pflag.ContinueOnError)
	c.Name = name
	for _, r := range register {
		r(fs)
	}
	fs.StringVar(&c.Addr, addrFlag, defaultAddr, "the metrics address of the daemon to ask")
	output := fs.StringP("output", "o", "text", "text or json")
	usage := "usage: " + name + " [flags]\n\nAsks the daemon running on this node (its metrics address) what it has programmed, and prints it."
	if code, ok := cli.SubcommandFlags(fs, usage, args, stdout, stderr); !ok {
		return c, code, false
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "%s: -o %q: want text or json\n", name, *output)
		return c, cli.ExitUsage, false
	}
	c.JSON = *output == "json"
	c.stderr = stderr
	return c, 0, true
}

// Fetch asks the daemon for its board into out; false (reported) when it
// could not.
func (c Command) Fetch(out any) bool {
	if err := Fetch(c.Addr, out); err != nil {
		fmt.Fprintf(c.stderr, "%s: %v\n", c.Name, err)
		return false
	}
	return true
}

// PrintJSON writes v indented, for -o json.
func PrintJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}
