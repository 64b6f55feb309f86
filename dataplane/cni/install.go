package cni

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

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

// MovedAsideSuffix is appended to the name of another network's config
// that Install moved aside: runtimes read only .conf, .conflist and .json
// files, and the suffix says whose doing it was (rename it back to undo).
const MovedAsideSuffix = ".podnet-moved-aside"

// ErrOtherNetworkFirst says another network's CNI config sorts ahead of
// podnet's: the runtime uses the first file, so pods would not get podnet.
var ErrOtherNetworkFirst = errors.New("another network's CNI config sorts ahead of " + ConflistName + ", so the container runtime would use it")

// othersAhead lists the CNI configs in dir that sort before podnet's (the
// runtime takes the first of *.conf, *.conflist and *.json by name).
func othersAhead(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var out []string
	for _, e := range entries {
		switch filepath.Ext(e.Name()) {
		case ".conf", ".conflist", ".json":
		default:
			continue
		}
		if !e.IsDir() && e.Name() < ConflistName {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	return out, nil
}

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
	// MoveOthersAside renames other networks' configs that sort ahead of
	// podnet's (appending MovedAsideSuffix) once podnet's is in place;
	// without it Install refuses them (ErrOtherNetworkFirst).
	MoveOthersAside bool
}

// Install refuses to install beside another network's config that sorts
// ahead of podnet's, unless MoveOthersAside. It copies the plugin binary to BinDir/podnet, each of the
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
	others, err := othersAhead(o.ConfDir)
	if err != nil {
		return nil, err
	}
	if len(others) > 0 && !o.MoveOthersAside {
		return nil, fmt.Errorf("%w: %s (remove it, or let podnet install --move-others-aside rename it to *%s)",
			ErrOtherNetworkFirst, strings.Join(others, ", "), MovedAsideSuffix)
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
	// After podnet's config is in place, so that the runtime never finds
	// none.
	for _, p := range others {
		if err := os.Rename(p, p+MovedAsideSuffix); err != nil {
			return changed, fmt.Errorf("move %s aside: %w", p, err)
		}
		changed = append(changed, p+MovedAsideSuffix)
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
