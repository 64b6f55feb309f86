package cni

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/podnet/podnet/dataplane/atomicfile"
)

// ConflistName is the file Install writes in the CNI config directory; the
// "10-" sorts it before most others, so runtimes pick it.
const ConflistName = "10-podnet.conflist"

// InstallOptions say where `podnet install` puts the plugin and its config.
type InstallOptions struct {
	// Self is the binary to copy; os.Executable() if empty.
	Self    string
	BinDir  string
	ConfDir string
	// Plugin fields written into the conflist entry; empty ones are left
	// out so the plugin's defaults apply.
	Bridge     string
	NodeConfig string
	DataDir    string
	LogFile    string
}

// Install copies the plugin binary to BinDir/podnet and writes
// ConfDir/10-podnet.conflist, each atomically (write, fsync, rename) and only
// when the content differs, so running it on every pod start is harmless.
// It returns the paths it changed.
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
	var changed []string
	for _, f := range []struct {
		path string
		data []byte
		perm os.FileMode
	}{
		{filepath.Join(o.BinDir, "podnet"), bin, 0o755},
		{filepath.Join(o.ConfDir, ConflistName), conf, 0o644},
	} {
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
		"bridge": o.Bridge, "nodeConfig": o.NodeConfig, "dataDir": o.DataDir, "logFile": o.LogFile,
	} {
		if v != "" {
			plugin[k] = v
		}
	}
	list := map[string]any{
		"cniVersion": "1.1.0",
		"name":       "podnet",
		"plugins":    []any{plugin},
	}
	data, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("encode conflist: %w", err)
	}
	return append(data, '\n'), nil
}
