package main

import (
	"encoding/json"
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
// error naming each, unless --drop names it. --patch FILE also writes
// those flags as a JSON patch of the podnet-dns Deployment (kubectl patch
// --type=json --patch-file FILE).
func runImportCorefile(args []string, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("dnsd import-corefile", pflag.ContinueOnError)
	fs.SetOutput(stderr)
	drop := fs.StringSlice("drop", nil, "plugins to leave out instead of refusing the Corefile (for example loadbalance)")
	patch := fs.String("patch", "", "also write the flags dnsd needs as a JSON patch (RFC 6902) adding them to the podnet-dns Deployment's dnsd command, for kubectl -n kube-system patch deploy podnet-dns --type=json --patch-file=FILE")
	fs.Usage = func() {
		fmt.Fprintln(stdout, "usage: dnsd import-corefile [--drop PLUGIN,...] [--patch FILE] COREFILE")
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
	out, flags, err := importCorefile(string(src), *drop)
	if err != nil {
		fmt.Fprintf(stderr, "dnsd import-corefile %s: %v\n", fs.Arg(0), err)
		return 1
	}
	if *patch != "" {
		if err := os.WriteFile(*patch, deploymentPatch(flags), 0o644); err != nil {
			fmt.Fprintln(stderr, "dnsd import-corefile: --patch:", err)
			return 1
		}
	}
	_, _ = io.WriteString(stdout, out)
	return 0
}

// dnsdContainer is where deploy/'s podnet-dns Deployment runs dnsd: its
// first container, by that name.
const dnsdContainer = "/spec/template/spec/containers/0"

// deploymentPatch is the JSON patch that appends flags to the dnsd
// container's command of the podnet-dns Deployment. It first tests that
// the container is dnsd, so a Deployment laid out otherwise is refused
// rather than patched in the wrong place.
func deploymentPatch(flags []string) []byte {
	type op struct {
		Op    string `json:"op"`
		Path  string `json:"path"`
		Value string `json:"value"`
	}
	ops := []op{{"test", dnsdContainer + "/name", "dnsd"}}
	for _, f := range flags {
		ops = append(ops, op{"add", dnsdContainer + "/command/-", f})
	}
	b, _ := json.Marshal(ops) // strings only: cannot fail
	return append(b, '\n')
}

// importCorefile converts src and checks that dnsd reads the result; it
// returns the config file and the flags dnsd needs besides.
func importCorefile(src string, drop []string) (string, []string, error) {
	blocks, err := corefile.Parse(src)
	if err != nil {
		return "", nil, err
	}
	res, err := corefile.Convert(blocks, drop)
	if err != nil {
		return "", nil, err
	}
	body, err := yaml.Marshal(res.Config)
	if err != nil {
		return "", nil, err
	}
	if _, err := dns.ParseFileConfig(body); err != nil {
		return "", nil, fmt.Errorf("the converted config: %w", err)
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
	return b.String(), res.Flags, nil
}
