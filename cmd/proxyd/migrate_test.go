package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// TestMigrationFlags: --pod-network none leaves the pod network to
// flannel; --take-over-from-kube-proxy arms the removal of kube-proxy's
// state after the first sync, and is refused where proxyd would serve no
// Service; a wrong value names its flag.
func TestMigrationFlags(t *testing.T) {
	parse := func(args ...string) (*flags, error) {
		var f flags
		fs := pflag.NewFlagSet("proxyd", pflag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(append([]string{"--state-dir", t.TempDir()}, args...)); err != nil {
			return nil, err
		}
		return &f, nil
	}
	f, _ := parse("--pod-network", "none", "--take-over-from-kube-proxy")
	o, err := f.options(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if !o.NoPodNetwork || o.ServiceProxy.TakeOver == nil {
		t.Errorf("NoPodNetwork %v, TakeOver set %v; want both", o.NoPodNetwork, o.ServiceProxy.TakeOver != nil)
	}
	f, _ = parse("--flannel-annotations")
	if o, err := f.options(slog.New(slog.DiscardHandler)); err != nil || !o.FlannelAnnotations {
		t.Errorf("--flannel-annotations: FlannelAnnotations %v, %v", o.FlannelAnnotations, err)
	}
	f, _ = parse()
	if o, err := f.options(slog.New(slog.DiscardHandler)); err != nil || o.NoPodNetwork || o.ServiceProxy.TakeOver != nil {
		t.Errorf("defaults: NoPodNetwork %v, TakeOver set %v, %v; want neither", o.NoPodNetwork, o.ServiceProxy.TakeOver != nil, err)
	}
	for args, want := range map[string]string{
		"--pod-network=flannel":                         "--pod-network: \"flannel\" is not podnet or none",
		"--take-over-from-kube-proxy --proxy-mode=none": "--take-over-from-kube-proxy: with --proxy-mode none",
	} {
		f, _ := parse(strings.Fields(args)...)
		if _, err := f.options(slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: err %v, want %q", args, err, want)
		}
	}
}
