// Command benchtable turns what make bench measured into BENCHMARKS.md's
// summary table.
//
//	benchtable extract DIR
//	    reads a run directory of scripts/bench.sh (meta.tsv and one PART.out
//	    per part run) and writes DIR/results.tsv: one row per figure of the
//	    summary the run measured, with the run's date and commit.
//	benchtable table [-doc BENCHMARKS.md] [-write] RESULTS.tsv...
//	    prints the summary table: the rows between the doc's
//	    <!-- summary:begin --> and <!-- summary:end --> lines, each replaced
//	    by the same measure and mode from the results files (later files
//	    win); with -write it also puts the table back into the doc.
//
// A row the runs did not measure keeps the figure, date and commit the doc
// has for it, so a partial run (BENCH=dns) updates only its own rows.
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "extract":
		if len(os.Args) != 3 {
			usage()
		}
		err = extractDir(os.Args[2])
	case "table":
		err = table(os.Args[2:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchtable:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: benchtable extract DIR | benchtable table [-doc FILE] [-write] RESULTS.tsv...")
	os.Exit(2)
}

// Meta is what scripts/bench.sh records about a run in meta.tsv.
type Meta struct {
	Date, Commit, Load, IPTables string
}

// when is the run's date with the load average at its start, which on
// this shared box moves every figure.
func (m Meta) when() string {
	if f := strings.Fields(m.Load); len(f) > 0 {
		return m.Date + " (load " + f[0] + ")"
	}
	return m.Date
}

func readMeta(path string) (Meta, error) {
	f, err := os.Open(path)
	if err != nil {
		return Meta{}, err
	}
	defer f.Close()
	var m Meta
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), "\t")
		switch k {
		case "date":
			m.Date = v
		case "commit":
			m.Commit = v
		case "load":
			m.Load = v
		case "iptables":
			m.IPTables = v
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if m.Date == "" || m.Commit == "" {
		return m, fmt.Errorf("%s: want date and commit lines", path)
	}
	return m, nil
}

// labMode names the lab's iptables mode from `iptables --version`.
func (m Meta) labMode() string {
	switch {
	case strings.Contains(m.IPTables, "nf_tables"):
		return "iptables-nft"
	case strings.Contains(m.IPTables, "legacy"):
		return "iptables-legacy"
	}
	return "iptables"
}

// Extract returns the summary's rows in the output of one part of a run;
// part is the file's name without ".out" (cni, routing, services, go,
// dns-1000, …).
func Extract(part, out string, m Meta) []Row {
	var rows []Row
	switch {
	case part == "cni":
		rows = extractCNI(out)
	case part == "routing":
		rows = extractRouting(out)
	case part == "services":
		rows = extractServices(out, m.labMode())
	case strings.HasPrefix(part, "dns"):
		rows = extractDNS(out)
	case part == "go":
		rows = extractGo(out)
	}
	for i := range rows {
		rows[i].Date, rows[i].Commit = m.when(), m.Commit
	}
	return rows
}

func extractDir(dir string) error {
	m, err := readMeta(filepath.Join(dir, "meta.tsv"))
	if err != nil {
		return err
	}
	outs, err := filepath.Glob(filepath.Join(dir, "*.out"))
	if err != nil {
		return err
	}
	sort.Strings(outs)
	var rows []Row
	for _, p := range outs {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		got := Extract(strings.TrimSuffix(filepath.Base(p), ".out"), string(b), m)
		fmt.Fprintf(os.Stderr, "benchtable: %s: %d figures\n", p, len(got))
		rows = append(rows, got...)
	}
	f, err := os.Create(filepath.Join(dir, "results.tsv"))
	if err != nil {
		return err
	}
	if err := WriteTSV(f, rows); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func table(args []string) error {
	fs := flag.NewFlagSet("table", flag.ExitOnError)
	doc := fs.String("doc", "BENCHMARKS.md", "the markdown file holding the summary between its markers")
	write := fs.Bool("write", false, "write the table back into -doc")
	fs.Parse(args)
	var results [][]Row
	for _, p := range fs.Args() {
		rows, err := readTSVFile(p)
		if err != nil {
			return err
		}
		results = append(results, rows)
	}
	old, err := os.ReadFile(*doc)
	if err != nil {
		return err
	}
	updated, rows, err := Rewrite(string(old), results...)
	if err != nil {
		return fmt.Errorf("%s: %w", *doc, err)
	}
	fmt.Print(Render(rows))
	if !*write {
		return nil
	}
	return writeAtomic(*doc, []byte(updated))
}

// writeAtomic replaces path with data through a temporary file beside it,
// so an interrupted write leaves the old document.
func writeAtomic(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".benchtable-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if st, err := os.Stat(path); err == nil {
		os.Chmod(tmp.Name(), st.Mode().Perm())
	}
	return os.Rename(tmp.Name(), path)
}
