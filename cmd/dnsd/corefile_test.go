package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	appsv1 "k8s.io/api/apps/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

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

// TestImportCorefilePatch: --patch writes the flags of the config's first
// comment as a JSON patch that, applied to deploy/'s podnet-dns
// Deployment, appends them to the dnsd container's command, after the
// base's own flags (so they win where both set one), and that dnsd
// accepts the resulting command line. A Deployment whose first container
// is not dnsd is refused.
func TestImportCorefilePatch(t *testing.T) {
	path := filepath.Join("..", "..", "dataplane", "corefile", "testdata", "kubeadm-stub.Corefile")
	patchFile := filepath.Join(t.TempDir(), "dnsd-flags.json")
	var out, errOut bytes.Buffer
	if code := runImportCorefile([]string{"--drop", "loadbalance", "--patch", patchFile, path}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	var flagLine string
	for _, l := range strings.Split(out.String(), "\n") {
		if s, ok := strings.CutPrefix(l, "# dnsd also needs these flags: "); ok {
			flagLine = s
		}
	}
	want := strings.Fields(flagLine)
	if len(want) == 0 {
		t.Fatalf("no flags in %q", out.String())
	}
	patch, err := os.ReadFile(patchFile)
	if err != nil {
		t.Fatal(err)
	}
	deploy := baseDNSDeployment(t)
	before := deploy.Spec.Template.Spec.Containers[0].Command
	patched := applyPatch(t, deploy, patch)
	got := patched.Spec.Template.Spec.Containers[0].Command
	if !slices.Equal(got, append(slices.Clone(before), want...)) {
		t.Errorf("command after the patch:\n%q\nwant the base's\n%q\nthen %q", got, before, want)
	}
	var f flags
	fs := pflag.NewFlagSet("dnsd", pflag.ContinueOnError)
	f.register(fs)
	if err := fs.Parse(got[1:]); err != nil {
		t.Errorf("dnsd refuses the patched command %q: %v", got, err)
	}

	deploy.Spec.Template.Spec.Containers[0].Name = "sidecar"
	doc, err := json.Marshal(deploy)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Apply(doc); err == nil {
		t.Error("the patch applied to a Deployment whose first container is not dnsd")
	}
}

// baseDNSDeployment is deploy/base's podnet-dns Deployment.
func baseDNSDeployment(t *testing.T) *appsv1.Deployment {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "..", "deploy", "base", "podnet.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for {
		var d appsv1.Deployment
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("no podnet-dns Deployment in deploy/base/podnet.yaml: %v", err)
		}
		if d.Kind == "Deployment" && d.Name == "podnet-dns" {
			return &d
		}
	}
}

func applyPatch(t *testing.T, d *appsv1.Deployment, patch []byte) *appsv1.Deployment {
	t.Helper()
	doc, err := json.Marshal(d)
	if err != nil {
		t.Fatal(err)
	}
	p, err := jsonpatch.DecodePatch(patch)
	if err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	doc, err = p.Apply(doc)
	if err != nil {
		t.Fatalf("patch %s: %v", patch, err)
	}
	var out appsv1.Deployment
	if err := yaml.Unmarshal(doc, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}
