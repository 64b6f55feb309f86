package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/dns"
)

// TestImportCorefile: dnsd import-corefile of kubeadm's Corefile with a
// stub domain prints a config file dnsd reads and flags dnsd accepts; the
// Corefile's loadbalance refuses it (exit 1, named on stderr) until
// --drop loadbalance.
func TestImportCorefile(t *testing.T) {
	path := filepath.Join("..", "..", "dataplane", "corefile", "testdata", "kubeadm-stub.Corefile")
	var out, errOut bytes.Buffer
	if code := runImportCorefile([]string{path}, &out, &errOut); code != 1 || !strings.Contains(errOut.String(), "line 22: loadbalance") {
		t.Errorf("exit %d, stderr %q; want 1 naming loadbalance", code, errOut.String())
	}
	out.Reset()
	if code := runImportCorefile([]string{"--drop", "loadbalance", path}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	cfg, err := dns.ParseFileConfig(out.Bytes())
	if err != nil {
		t.Fatalf("dnsd cannot read %q: %v", out.String(), err)
	}
	if got := cfg.StubDomains["corp.example"]; len(got) != 2 {
		t.Errorf("stub domain: %v", got)
	}
	var flagLine string
	for _, l := range strings.Split(out.String(), "\n") {
		if s, ok := strings.CutPrefix(l, "# dnsd also needs these flags: "); ok {
			flagLine = s
		}
	}
	var f flags
	fs := pflag.NewFlagSet("dnsd", pflag.ContinueOnError)
	f.register(fs)
	cfgFile := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(cfgFile, out.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := fs.Parse(append(strings.Fields(flagLine), "--config", cfgFile)); err != nil || !strings.Contains(flagLine, "--ttl=30") {
		t.Errorf("flags %q: %v", flagLine, err)
	}
	if _, err := f.config(); err != nil {
		t.Errorf("dnsd's config from the flags %q: %v", flagLine, err)
	}
}
