package cni

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func TestInstallIsAtomicAndIdempotent(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	if err := os.WriteFile(self, []byte("binary v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := InstallOptions{Self: self, BinDir: filepath.Join(dir, "bin"), ConfDir: filepath.Join(dir, "net.d"), NodeConfig: "/run/x/node.json"}
	changed, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 2 {
		t.Errorf("first install changed %v, want the binary and the conflist", changed)
	}
	bin, err := os.ReadFile(filepath.Join(o.BinDir, "podnet"))
	if err != nil || !bytes.Equal(bin, []byte("binary v1")) {
		t.Errorf("installed binary %q, %v", bin, err)
	}
	if st, _ := os.Stat(filepath.Join(o.BinDir, "podnet")); st == nil || st.Mode().Perm() != 0o755 {
		t.Errorf("binary mode %v, want 0755", st)
	}
	list, err := libcni.ConfListFromFile(filepath.Join(o.ConfDir, ConflistName))
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" || list.Name != "podnet" || len(list.Plugins) != 1 || list.Plugins[0].Network.Type != "podnet" {
		t.Errorf("conflist %+v", list)
	}
	var plugin map[string]any
	json.Unmarshal(list.Plugins[0].Bytes, &plugin)
	if plugin["nodeConfig"] != "/run/x/node.json" {
		t.Errorf("plugin entry %v, want nodeConfig /run/x/node.json", plugin)
	}
	if _, err := ParseConfig(list.Plugins[0].Bytes); err != nil {
		t.Errorf("the plugin rejects its own conflist entry: %v", err)
	}

	if changed, err := Install(o); err != nil || len(changed) != 0 {
		t.Errorf("second install changed %v (%v), want nothing", changed, err)
	}
	if err := os.WriteFile(self, []byte("binary v2"), 0o755); err != nil {
		t.Fatal(err)
	}
	if changed, err := Install(o); err != nil || len(changed) != 1 || changed[0] != filepath.Join(o.BinDir, "podnet") {
		t.Errorf("install of a new binary changed %v (%v), want only the binary", changed, err)
	}
	left, _ := filepath.Glob(filepath.Join(o.BinDir, ".*"))
	left2, _ := filepath.Glob(filepath.Join(o.ConfDir, ".*"))
	if len(left)+len(left2) != 0 {
		t.Errorf("temp files left behind: %v %v", left, left2)
	}
}
