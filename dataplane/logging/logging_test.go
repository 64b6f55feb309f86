package logging

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/spf13/pflag"
	"k8s.io/klog/v2"
)

func parse(t *testing.T, args ...string) Options {
	t.Helper()
	var o Options
	fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
	o.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return o
}

func TestJSONWithVerbosityCarriesKlog(t *testing.T) {
	var buf bytes.Buffer
	log, err := parse(t, "-v", "4", "--log-format", "json").New(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("own debug")
	klog.V(4).InfoS("client-go at V(4)", "k", "v")
	klog.V(5).InfoS("client-go at V(5)")
	klog.Flush()
	var msgs []string
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("line %q is not JSON: %v", line, err)
		}
		msgs = append(msgs, rec["msg"].(string))
		if rec["msg"] == "client-go at V(4)" && (rec["component"] != "client-go" || rec["k"] != "v") {
			t.Errorf("klog record %v lacks its component or its values", rec)
		}
	}
	want := []string{"own debug", "client-go at V(4)"}
	if strings.Join(msgs, "|") != strings.Join(want, "|") {
		t.Errorf("logged %q, want %q", msgs, want)
	}
}

func TestDefaultTextHidesDebug(t *testing.T) {
	var buf bytes.Buffer
	log, err := parse(t).New(&buf)
	if err != nil {
		t.Fatal(err)
	}
	log.Debug("hidden")
	klog.V(2).InfoS("hidden too")
	log.Info("shown")
	klog.Flush()
	if out := buf.String(); strings.Contains(out, "hidden") || !strings.Contains(out, "level=INFO msg=shown") {
		t.Errorf("default logging wrote %q, want only the info line, as text", out)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"--log-format", "xml"}, {"--log-level", "loud"}, {"-v", "-1"}} {
		if _, err := parse(t, args...).New(&bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), strings.TrimLeft(args[0], "-")) {
			t.Errorf("%v: error %v, want one naming the flag", args, err)
		}
	}
}
