package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/pflag"
	"sigs.k8s.io/yaml"

	"github.com/podnet/podnet/dataplane/corefile"
	"github.com/podnet/podnet/dataplane/dns"
)

// runImportCorefile is `dnsd import-corefile FILE`: the Corefile's DNS
// settings as dnsd's config file on stdout (the podnet-dns ConfigMap's
// config.yaml), the flags it also needs and what was carried over
// differently as comments at its top. A plugin dnsd cannot honour is an
// error naming each, unless --drop names it.
func runImportCorefile(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("dnsd import-corefile", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	drop := fs.StringSlice("drop", nil, "plugins to leave out instead of refusing the Corefile (for example loadbalance)")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: dnsd import-corefile [--drop PLUGIN,...] COREFILE")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); errors.Is(err, pflag.ErrHelp) {
		return 0
	} else if err != nil {
		return 2
	}
	if fs.NArg() != 1 {
		fmt.Fprintln(stderr, "dnsd import-corefile: name one Corefile")
		return 2
	}
	src, err := os.ReadFile(fs.Arg(0))
	if err != nil {
		fmt.Fprintln(stderr, "dnsd import-corefile:", err)
		return 1
	}
	out, err := importCorefile(string(src), *drop)
	if err != nil {
		fmt.Fprintf(stderr, "dnsd import-corefile %s: %v\n", fs.Arg(0), err)
		return 1
	}
	_, _ = io.WriteString(stdout, out)
	return 0
}

// importCorefile converts src and checks that dnsd reads the result.
func importCorefile(src string, drop []string) (string, error) {
	blocks, err := corefile.Parse(src)
	if err != nil {
		return "", err
	}
	res, err := corefile.Convert(blocks, drop)
	if err != nil {
		return "", err
	}
	body, err := yaml.Marshal(res.Config)
	if err != nil {
		return "", err
	}
	if _, err := dns.ParseFileConfig(body); err != nil {
		return "", fmt.Errorf("the converted config: %w", err)
	}
	var b strings.Builder
	b.WriteString("# dnsd's config file, from a Corefile (dnsd import-corefile).\n")
	if len(res.Flags) > 0 {
		fmt.Fprintf(&b, "# dnsd also needs these flags: %s\n", strings.Join(res.Flags, " "))
	}
	for _, n := range res.Notes {
		fmt.Fprintf(&b, "# %s\n", n)
	}
	b.Write(body)
	return b.String(), nil
}
