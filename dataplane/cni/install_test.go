package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"
)

func TestInstallIsAtomicAndIdempotent(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	if err := os.WriteFile(self, []byte("binary v1"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, name := range ReferencePlugins {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(name+" v1"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	o := InstallOptions{Self: self, BinDir: filepath.Join(dir, "bin"), ConfDir: filepath.Join(dir, "net.d"), NodeConfig: "/run/x/node.json"}
	changed, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if len(changed) != 4 {
		t.Errorf("first install changed %v, want the binary, loopback, portmap and the conflist", changed)
	}
	for _, name := range ReferencePlugins {
		if got, err := os.ReadFile(filepath.Join(o.BinDir, name)); err != nil || string(got) != name+" v1" {
			t.Errorf("installed %s %q, %v; want the one beside the binary", name, got, err)
		}
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
	// libcni 1.3 reads cniVersions and picks the highest it speaks.
	if list.CNIVersion != "1.1.0" || list.Name != "podnet" || len(list.Plugins) != 2 || list.Plugins[0].Network.Type != "podnet" {
		t.Errorf("conflist %+v", list)
	}
	// hostPorts: portmap chained after podnet, asking the runtime for them.
	if len(list.Plugins) == 2 && (list.Plugins[1].Network.Type != PortmapName || !list.Plugins[1].Network.Capabilities["portMappings"]) {
		t.Errorf("second plugin %+v, want portmap with the portMappings capability", list.Plugins[1].Network)
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

// TestConflistVersions checks the conflist against both kinds of runtime: one
// that ignores cniVersions (libcni 1.1, as in containerd 1.6 and 1.7) uses
// cniVersion, which must be one it accepts results of; one that reads the
// list gets the newest version the plugin speaks. Every listed version must
// be one the plugin speaks.
func TestConflistVersions(t *testing.T) {
	data, err := Conflist(InstallOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var raw struct {
		CNIVersion  string   `json:"cniVersion"`
		CNIVersions []string `json:"cniVersions"`
	}
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatal(err)
	}
	// The result versions libcni 1.1.x converts (containerd 1.6.20 failed
	// with `unsupported CNI result version "1.1.0"`).
	libcni11 := map[string]bool{"0.1.0": true, "0.2.0": true, "0.3.0": true, "0.3.1": true, "0.4.0": true, "1.0.0": true}
	if !libcni11[raw.CNIVersion] {
		t.Errorf("cniVersion %q is not one containerd 1.6 accepts results of", raw.CNIVersion)
	}
	speaks := map[string]bool{}
	for _, v := range VersionInfo.SupportedVersions() {
		speaks[v] = true
	}
	if !speaks[raw.CNIVersion] {
		t.Errorf("cniVersion %q is not one the plugin speaks (%v)", raw.CNIVersion, VersionInfo.SupportedVersions())
	}
	for _, v := range raw.CNIVersions {
		if !speaks[v] {
			t.Errorf("cniVersions lists %q, which the plugin does not speak", v)
		}
	}
	if !slices.Contains(raw.CNIVersions, raw.CNIVersion) || !slices.Contains(raw.CNIVersions, "1.1.0") {
		t.Errorf("cniVersions %v should hold cniVersion %q and 1.1.0", raw.CNIVersions, raw.CNIVersion)
	}
	list, err := libcni.ConfListFromBytes(data)
	if err != nil {
		t.Fatal(err)
	}
	if list.CNIVersion != "1.1.0" {
		t.Errorf("libcni 1.3 picked cniVersion %q from the list, want 1.1.0", list.CNIVersion)
	}
}

// TestInstallKeepsTheNodesReferencePlugins: a loopback or portmap already in
// the bin dir (the node's own CNI plugins) is left alone, and none to copy is
// then no error; with neither, install fails and says so before writing
// anything.
func TestInstallKeepsTheNodesReferencePlugins(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	if err := os.WriteFile(self, []byte("binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	o := InstallOptions{Self: self, BinDir: filepath.Join(dir, "bin"), ConfDir: filepath.Join(dir, "net.d")}

	_, err := Install(o)
	if err == nil || !strings.Contains(err.Error(), "loopback") {
		t.Fatalf("install without any loopback: %v, want an error naming loopback", err)
	}
	if left, _ := os.ReadDir(o.ConfDir); len(left) != 0 {
		t.Errorf("a failed install wrote %v", left)
	}

	if err := os.MkdirAll(o.BinDir, 0o755); err != nil {
		t.Fatal(err)
	}
	nodes := filepath.Join(o.BinDir, LoopbackName)
	if err := os.WriteFile(nodes, []byte("the node's loopback"), 0o755); err != nil {
		t.Fatal(err)
	}
	// podnet's own: only portmap, which the node lacks, is taken from here.
	o.ReferencePluginDir = filepath.Join(dir, "podnet-plugins")
	if err := os.MkdirAll(o.ReferencePluginDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(o.ReferencePluginDir, PortmapName), []byte("podnet's portmap"), 0o755); err != nil {
		t.Fatal(err)
	}
	changed, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	if slices.Contains(changed, nodes) {
		t.Errorf("install replaced the node's loopback (changed %v)", changed)
	}
	if got, _ := os.ReadFile(nodes); string(got) != "the node's loopback" {
		t.Errorf("loopback now %q", got)
	}
	if got, _ := os.ReadFile(filepath.Join(o.BinDir, PortmapName)); string(got) != "podnet's portmap" {
		t.Errorf("portmap %q, want podnet's", got)
	}
}

// TestInstallBesideAnotherNetwork: a config of another network sorting
// ahead of podnet's (flannel's 10-flannel.conflist) makes install refuse,
// naming it and changing nothing; with MoveOthersAside it is renamed out of
// the runtime's sight once podnet's is in place. Files sorting after
// podnet's, or that runtimes do not read, stay.
func TestInstallBesideAnotherNetwork(t *testing.T) {
	dir := t.TempDir()
	self := filepath.Join(dir, "self")
	os.WriteFile(self, []byte("binary"), 0o755)
	o := InstallOptions{Self: self, BinDir: filepath.Join(dir, "bin"), ConfDir: filepath.Join(dir, "net.d")}
	os.MkdirAll(o.BinDir, 0o755)
	for _, name := range ReferencePlugins {
		os.WriteFile(filepath.Join(o.BinDir, name), []byte(name), 0o755)
	}
	os.MkdirAll(o.ConfDir, 0o755)
	others := map[string]bool{"10-flannel.conflist": true, "05-cilium.conf": true, "99-loopback.conf": false, "00-notes.txt": false}
	for name := range others {
		os.WriteFile(filepath.Join(o.ConfDir, name), []byte("{}"), 0o644)
	}
	_, err := Install(o)
	if !errors.Is(err, ErrOtherNetworkFirst) || !strings.Contains(err.Error(), "10-flannel.conflist") ||
		!strings.Contains(err.Error(), "05-cilium.conf") || strings.Contains(err.Error(), "99-loopback") || !strings.Contains(err.Error(), "--move-others-aside") {
		t.Fatalf("install beside flannel: %v; want a refusal naming 05-cilium.conf and 10-flannel.conflist and the flag", err)
	}
	if _, err := os.Stat(filepath.Join(o.ConfDir, ConflistName)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused install wrote %s: %v", ConflistName, err)
	}

	o.MoveOthersAside = true
	changed, err := Install(o)
	if err != nil {
		t.Fatal(err)
	}
	for name, ahead := range others {
		p := filepath.Join(o.ConfDir, name)
		_, errKept := os.Stat(p)
		_, errMoved := os.Stat(p + MovedAsideSuffix)
		if ahead && (errKept == nil || errMoved != nil || !slices.Contains(changed, p+MovedAsideSuffix)) {
			t.Errorf("%s: not moved aside (changed %v)", name, changed)
		}
		if !ahead && (errKept != nil || errMoved == nil) {
			t.Errorf("%s moved though it does not sort ahead or is no config", name)
		}
	}
	if files, _ := libcni.ConfFiles(o.ConfDir, []string{".conf", ".conflist", ".json"}); len(files) == 0 || filepath.Base(files[0]) != ConflistName {
		t.Errorf("the runtime's first config is %v, want %s", files, ConflistName)
	}
}
