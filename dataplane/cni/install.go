package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/podnet/podnet/dataplane/atomicfile"
)

// ConflistName is the file Install writes in the CNI config directory; the
// "10-" sorts it before most others, so runtimes pick it.
const ConflistName = "10-podnet.conflist"

// LoopbackName is the CNI reference plugin that brings up "lo" in a pod.
// containerd's CRI runs it from its CNI bin dir for every sandbox, whatever
// the conflist says, and fails the sandbox when it is missing.
const LoopbackName = "loopback"

// PortmapName is the CNI reference plugin chained after podnet in the
// conflist: it maps a pod's hostPorts (the runtime passes them as the
// portMappings capability), which podnet itself does not.
const PortmapName = "portmap"

// ReferencePlugins are the CNI reference plugins Install puts beside podnet
// when the node has none of its own.
var ReferencePlugins = []string{LoopbackName, PortmapName}

// ConflistVersion is the cniVersion of the installed conflist: the version a
// runtime uses when it does not read cniVersions. libcni 1.1 (containerd 1.6
// and 1.7) rejects the result of any version above 1.0.0, and runtimes on
// libcni 0.8 stop at 0.4.0, so the conservative choice is 0.4.0; nothing
// podnet does needs more from an older runtime.
const ConflistVersion = "0.4.0"

// ConflistVersions is the spec's cniVersions list: a runtime that reads it
// (libcni 1.2 and later) picks the highest it supports, so containerd 2 gets
// 1.1.0 and with it STATUS and GC.
var ConflistVersions = []string{"0.3.1", ConflistVersion, "1.0.0", "1.1.0"}

// InstallOptions say where `podnet install` puts the plugin and its config.
type InstallOptions struct {
	// Self is the binary to copy; os.Executable() if empty.
	Self string
	// ReferencePluginDir holds the ReferencePlugins to install where BinDir
	// has none; the directory of Self if empty.
	ReferencePluginDir string
	BinDir             string
	ConfDir            string
	// Plugin fields written into the conflist entry; empty ones are left
	// out so the plugin's defaults apply.
	Bridge     string
	NodeConfig string
	DataDir    string
	LogFile    string
	LogFormat  string
}

// Install copies the plugin binary to BinDir/podnet, each of the
// ReferencePlugins the node does not have yet (its own CNI plugins stay as
// they are), and writes ConfDir/10-podnet.conflist, each atomically
// (write, fsync, rename) and only when the content differs, so running it on
// every pod start is harmless. It returns the paths it changed.
func Install(o InstallOptions) ([]string, error) {
	self := o.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find own binary: %w", err)
		}
	}
	bin, err := os.ReadFile(self)
	if err != nil {
		return nil, fmt.Errorf("read own binary: %w", err)
	}
	conf, err := Conflist(o)
	if err != nil {
		return nil, err
	}
	type file struct {
		path string
		data []byte
		perm os.FileMode
	}
	files := []file{{filepath.Join(o.BinDir, "podnet"), bin, 0o755}}
	srcDir := o.ReferencePluginDir
	if srcDir == "" {
		srcDir = filepath.Dir(self)
	}
	for _, name := range ReferencePlugins {
		dst := filepath.Join(o.BinDir, name)
		if _, err := os.Stat(dst); err == nil {
			continue
		} else if !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("look for %s: %w", dst, err)
		}
		data, err := os.ReadFile(filepath.Join(srcDir, name))
		if err != nil {
			return nil, fmt.Errorf("read the %s plugin to install (%s has none): %w", name, o.BinDir, err)
		}
		files = append(files, file{dst, data, 0o755})
	}
	files = append(files, file{filepath.Join(o.ConfDir, ConflistName), conf, 0o644})
	var changed []string
	for _, f := range files {
		if old, err := os.ReadFile(f.path); err == nil && bytes.Equal(old, f.data) {
			continue
		}
		if err := atomicfile.WriteFile(f.path, f.data, f.perm); err != nil {
			return changed, fmt.Errorf("install %s: %w", f.path, err)
		}
		changed = append(changed, f.path)
	}
	return changed, nil
}

// Conflist renders the network config list Install writes.
func Conflist(o InstallOptions) ([]byte, error) {
	plugin := map[string]any{"type": "podnet"}
	for k, v := range map[string]string{
		"bridge": o.Bridge, "nodeConfig": o.NodeConfig, "dataDir": o.DataDir, "logFile": o.LogFile, "logFormat": o.LogFormat,
	} {
		if v != "" {
			plugin[k] = v
		}
	}
	list := map[string]any{
		"cniVersion":  ConflistVersion,
		"cniVersions": ConflistVersions,
		"name":        "podnet",
		"plugins":     []any{plugin, map[string]any{"type": PortmapName, "capabilities": map[string]bool{"portMappings": true}}},
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode conflist: %w", err)
	}
	return append(data, '\n'), nil
}
