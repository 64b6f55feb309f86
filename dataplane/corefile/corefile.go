// Package corefile carries a CoreDNS Corefile's DNS settings over to dnsd
// (`dnsd import-corefile`): the root server block's forward, hosts, cache,
// kubernetes, autopath, log and errors, and each other server block as a
// stub domain, become dnsd's config file and flags. A plugin dnsd cannot
// honour is refused, each named with its line, unless the caller says to
// drop it.
package corefile

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/podnet/podnet/dataplane/dns"
)

// Directive is one plugin line of a server block, with its own block's
// lines (each a directive of its own).
type Directive struct {
	Name  string
	Args  []string
	Block []Directive
	Line  int
}

// ServerBlock is one server block: its keys (zone[:port]) and plugins.
type ServerBlock struct {
	Keys       []string
	Directives []Directive
}

// Parse reads a Corefile.
func Parse(src string) ([]ServerBlock, error) {
	lines, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	var out []ServerBlock
	for len(lines) > 0 {
		l := lines[0]
		if l.toks[len(l.toks)-1] != "{" {
			return nil, fmt.Errorf("line %d: server block %q without {", l.line, strings.Join(l.toks, " "))
		}
		b := ServerBlock{Keys: l.toks[:len(l.toks)-1]}
		var rest []tline
		if b.Directives, rest, err = directives(lines[1:], l.line); err != nil {
			return nil, err
		}
		out = append(out, b)
		lines = rest
	}
	return out, nil
}

// tline is one line's tokens ("{" and "}" stand alone).
type tline struct {
	toks []string
	line int
}

// directives reads lines up to the "}" closing a block opened on line
// open, and returns what follows it.
func directives(lines []tline, open int) ([]Directive, []tline, error) {
	var out []Directive
	for len(lines) > 0 {
		l := lines[0]
		lines = lines[1:]
		if l.toks[0] == "}" {
			return out, lines, nil
		}
		d := Directive{Name: l.toks[0], Args: l.toks[1:], Line: l.line}
		if n := len(d.Args); n > 0 && d.Args[n-1] == "{" {
			d.Args = d.Args[:n-1]
			var err error
			if d.Block, lines, err = directives(lines, l.line); err != nil {
				return nil, nil, err
			}
		}
		out = append(out, d)
	}
	return nil, nil, fmt.Errorf("line %d: { never closed", open)
}

// tokenize splits src into lines of tokens: "{" ends a line, "}" is a
// line of its own, comments (#) end at the line's end, a quoted string is
// one token.
func tokenize(src string) ([]tline, error) {
	var out []tline
	var cur tline
	var tok strings.Builder
	line := 1
	endTok := func() {
		if tok.Len() > 0 {
			if len(cur.toks) == 0 {
				cur.line = line
			}
			cur.toks = append(cur.toks, tok.String())
			tok.Reset()
		}
	}
	endLine := func() {
		endTok()
		if len(cur.toks) > 0 {
			out = append(out, cur)
		}
		cur = tline{}
	}
	rs := []rune(src)
	for i := 0; i < len(rs); i++ {
		switch r := rs[i]; {
		case r == '\n':
			endLine()
			line++
		case r == '#':
			for i+1 < len(rs) && rs[i+1] != '\n' {
				i++
			}
		case r == '"':
			j := i + 1
			for j < len(rs) && rs[j] != '"' && rs[j] != '\n' {
				j++
			}
			if j == len(rs) || rs[j] != '"' {
				return nil, fmt.Errorf("line %d: quote never closed", line)
			}
			tok.WriteString(string(rs[i+1 : j]))
			i = j
		case r == '{':
			endTok()
			tok.WriteRune(r)
			endLine()
		case r == '}':
			endLine()
			cur = tline{toks: []string{"}"}, line: line}
			endLine()
		case r == ' ' || r == '\t' || r == '\r':
			endTok()
		default:
			tok.WriteRune(r)
		}
	}
	endLine()
	return out, nil
}

// Result is a Corefile in dnsd's terms.
type Result struct {
	Config dns.FileConfig
	// Flags are dnsd's flags for what the config file does not hold.
	Flags []string
	// Notes say what was carried over differently or dropped on request.
	Notes []string
}

// Convert turns a Corefile's server blocks into dnsd's config and flags.
// Plugins dnsd cannot honour are refused, all of them named with their
// lines in one error, except those in drop, which are left out with a
// note.
func Convert(blocks []ServerBlock, drop []string) (Result, error) {
	c := converter{drop: drop}
	for _, b := range blocks {
		zone, err := blockZone(b.Keys)
		if err != nil {
			return Result{}, err
		}
		if zone == "." {
			c.root(b)
		} else {
			c.stub(zone, b)
		}
	}
	if len(c.refused) > 0 {
		return Result{}, fmt.Errorf("dnsd cannot honour: %s (--drop NAME leaves a plugin out)", strings.Join(c.refused, "; "))
	}
	return c.out, nil
}

// blockZone is the zone of a server block's keys, which must all be one
// zone on port 53 (dnsd serves one set of ports).
func blockZone(keys []string) (string, error) {
	zone := ""
	for _, k := range keys {
		k = strings.TrimPrefix(k, "dns://")
		z, port, hasPort := strings.Cut(k, ":")
		if hasPort && port != "53" {
			return "", fmt.Errorf("server block %s: port %s; dnsd serves every zone on its --listen addresses", k, port)
		}
		z = strings.TrimSuffix(z, ".") + "."
		if z == ".." {
			z = "."
		}
		if zone != "" && z != zone {
			return "", fmt.Errorf("server block %s: several zones in one block", strings.Join(keys, " "))
		}
		zone = z
	}
	return zone, nil
}

type converter struct {
	drop    []string
	out     Result
	refused []string
	// clusterZones are the root block's kubernetes plugin's zones.
	clusterZones []string
}

func (c *converter) refuse(d Directive, why string) {
	if slices.Contains(c.drop, d.Name) {
		c.out.Notes = append(c.out.Notes, fmt.Sprintf("line %d: %s left out (--drop)", d.Line, d.Name))
		return
	}
	c.refused = append(c.refused, fmt.Sprintf("line %d: %s (%s)", d.Line, d.Name, why))
}

func (c *converter) flag(f string) { c.out.Flags = append(c.out.Flags, f) }

func (c *converter) note(d Directive, s string) {
	c.out.Notes = append(c.out.Notes, fmt.Sprintf("line %d: %s: %s", d.Line, d.Name, s))
}

// upstreams are forward's destinations as dnsd's nameservers; nil with
// ok for /etc/resolv.conf (dnsd's default).
func upstreams(args []string) ([]string, string) {
	var out []string
	for _, a := range args {
		switch {
		case a == "/etc/resolv.conf":
			continue
		case strings.Contains(a, "://") && !strings.HasPrefix(a, "dns://"):
			return nil, a + ": only plain DNS upstreams"
		}
		a = strings.TrimPrefix(a, "dns://")
		if _, err := netip.ParseAddr(a); err != nil {
			if _, err := netip.ParseAddrPort(a); err != nil {
				return nil, a + ": not an address"
			}
		}
		out = append(out, a)
	}
	return out, ""
}
