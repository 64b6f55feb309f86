package cni

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// execPlugin runs the built plugin with the given CNI environment and stdin
// and returns its stdout; the error JSON of a failing verb is decoded.
func execPlugin(t *testing.T, env map[string]string, stdin string) (out []byte, code uint, msg string) {
	t.Helper()
	cmd := exec.Command(filepath.Join(pluginDir(t), "podnet"))
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin = strings.NewReader(stdin)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	err := cmd.Run()
	if err == nil {
		return stdout.Bytes(), 0, ""
	}
	var e struct {
		Code uint   `json:"code"`
		Msg  string `json:"msg"`
	}
	if jerr := json.Unmarshal(stdout.Bytes(), &e); jerr != nil {
		t.Fatalf("plugin failed (%v) without CNI error JSON on stdout: %q", err, stdout.String())
	}
	return stdout.Bytes(), e.Code, e.Msg
}

func TestPluginBinaryErrorCodes(t *testing.T) {
	dir := t.TempDir()
	base := map[string]string{"CNI_PATH": dir, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0", "CNI_NETNS": "/run/netns/none"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{}
		for k, v := range base {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if kv[i+1] == "" {
				delete(m, kv[i])
			} else {
				m[kv[i]] = kv[i+1]
			}
		}
		return m
	}
	conf := func(extra string) string {
		return `{"cniVersion":"1.1.0","name":"podnet","type":"podnet","dataDir":"` + dir + `/ipam","nodeConfig":"` + dir + `/node.json"` + extra + `}`
	}

	out, code, _ := execPlugin(t, with("CNI_COMMAND", "VERSION"), "")
	var vi struct {
		Supported []string `json:"supportedVersions"`
	}
	if code != 0 || json.Unmarshal(out, &vi) != nil || !slices.Equal(vi.Supported, []string{"0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"}) {
		t.Errorf("VERSION: code %d, %s", code, out)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "ADD", "CNI_CONTAINERID", ""), conf("")); code != 4 || !strings.Contains(msg, "CNI_CONTAINERID") {
		t.Errorf("ADD without CNI_CONTAINERID: code %d %q, want 4 naming the variable", code, msg)
	}
	if _, code, _ := execPlugin(t, with("CNI_COMMAND", "ADD"), `{"name":"podnet",`); code != 6 {
		t.Errorf("ADD with truncated JSON: code %d, want 6", code)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "ADD"), conf(`,"mtu":"big"`)); code != 7 || !strings.Contains(msg, `mtu: want an integer, got "big"`) {
		t.Errorf("ADD with mtu \"big\": code %d %q, want 7 naming field and value", code, msg)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "ADD"), conf("")); code != 11 || !strings.Contains(msg, dir+"/node.json") {
		t.Errorf("ADD before the node config exists: code %d %q, want 11 naming the file", code, msg)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "ADD"), conf(`,"subnet":"10.9.0.0/24"`)); code != 4 || !strings.Contains(msg, "/run/netns/none") {
		t.Errorf("ADD with a missing netns: code %d %q, want 4 naming CNI_NETNS", code, msg)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "STATUS"), conf("")); code != 50 || !strings.Contains(msg, dir+"/node.json") {
		t.Errorf("STATUS before the node config exists: code %d %q, want 50 naming the file", code, msg)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "STATUS"), conf(`,"subnet":"10.9.0.0/24"`)); code != 0 {
		t.Errorf("STATUS with a subnet: code %d %q, want ready", code, msg)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "CHECK"), conf(`,"subnet":"10.9.0.0/24"`)); code != 7 || !strings.Contains(msg, "prevResult") {
		t.Errorf("CHECK without prevResult: code %d %q, want 7", code, msg)
	}
	if _, code, msg := execPlugin(t, with("CNI_COMMAND", "GC"), conf("")); code != 7 || !strings.Contains(msg, "cni.dev/valid-attachments") {
		t.Errorf("GC without the valid attachments list: code %d %q, want 7", code, msg)
	}
}

// TestPluginBinaryVerbsWithoutState runs the verbs that look at links in a
// node namespace of their own: they must succeed on a node that has nothing.
func TestPluginBinaryVerbsWithoutState(t *testing.T) {
	node := newTestNode(t, nodeOptions{noNodeConfig: true})
	dir := t.TempDir()
	conf := `{"cniVersion":"1.1.0","name":"podnet","type":"podnet","dataDir":"` + dir + `/ipam","nodeConfig":"` + dir + `/node.json"`
	env := map[string]string{"CNI_PATH": dir, "CNI_CONTAINERID": "c1", "CNI_IFNAME": "eth0"}
	inNS(t, node.ns, func() error {
		env["CNI_COMMAND"] = "DEL" // no netns, no node config, never added
		if _, code, msg := execPlugin(t, env, conf+"}"); code != 0 {
			t.Errorf("DEL of an unknown container: code %d %q", code, msg)
		}
		env["CNI_COMMAND"] = "GC"
		if _, code, msg := execPlugin(t, env, conf+`,"cni.dev/valid-attachments":[]}`); code != 0 {
			t.Errorf("GC with an empty list on an empty node: code %d %q", code, msg)
		}
		return nil
	})
}

func TestPluginBinaryCLI(t *testing.T) {
	bin := filepath.Join(pluginDir(t), "podnet")
	out, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.HasPrefix(string(out), "podnet ") {
		t.Errorf("--version: %q, %v", out, err)
	}
	if out, err := exec.Command(bin, "--help").CombinedOutput(); err != nil || !strings.Contains(string(out), "install") {
		t.Errorf("--help: %q, %v", out, err)
	}
	dir := t.TempDir()
	out, err = exec.Command(bin, "install", "--cni-bin-dir", dir+"/bin", "--cni-conf-dir", dir+"/net.d").CombinedOutput()
	if err != nil {
		t.Fatalf("install: %v\n%s", err, out)
	}
	a, _ := os.ReadFile(bin)
	b, _ := os.ReadFile(dir + "/bin/podnet")
	if !bytes.Equal(a, b) {
		t.Error("installed binary differs from the running one")
	}
	if _, err := os.Stat(dir + "/net.d/" + ConflistName); err != nil {
		t.Error(err)
	}
	// The installed reference plugins are real ones, ready to be exec'd.
	for _, name := range ReferencePlugins {
		cmd := exec.Command(dir + "/bin/" + name)
		cmd.Env = []string{"CNI_COMMAND=VERSION"}
		cmd.Stdin = strings.NewReader(`{"cniVersion":"0.4.0"}`)
		if out, err := cmd.Output(); err != nil || !strings.Contains(string(out), `"supportedVersions"`) {
			t.Errorf("installed %s answers VERSION with %q, %v", name, out, err)
		}
	}
}
