// Package chart renders podnet's Helm chart (deploy/helm/podnet) with
// Helm's own Go packages, as `helm template` does, with no cluster and no
// network: what the tests compare with deploy/'s kustomize output and
// what the real-node test installs.
package chart

import (
	"fmt"
	"path"
	"sort"
	"strings"

	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/engine"
)

// Render renders the chart in dir with values over its values.yaml and
// returns the manifests, one YAML stream, templates in name order.
func Render(dir string, values map[string]any) (string, error) {
	c, err := loader.Load(dir)
	if err != nil {
		return "", fmt.Errorf("load chart %s: %w", dir, err)
	}
	vals, err := chartutil.ToRenderValues(c, values, chartutil.ReleaseOptions{Name: "podnet", Namespace: "podnet-system", IsInstall: true}, chartutil.DefaultCapabilities)
	if err != nil {
		return "", fmt.Errorf("chart %s: values: %w", dir, err)
	}
	out, err := engine.Render(c, vals)
	if err != nil {
		return "", fmt.Errorf("render chart %s: %w", dir, err)
	}
	names := make([]string, 0, len(out))
	for name := range out {
		if path.Ext(name) == ".yaml" && !strings.HasPrefix(path.Base(name), "_") {
			names = append(names, name)
		}
	}
	sort.Strings(names)
	var b strings.Builder
	for _, name := range names {
		if strings.TrimSpace(out[name]) == "" {
			continue
		}
		fmt.Fprintf(&b, "---\n# Source: %s\n%s\n", name, out[name])
	}
	return b.String(), nil
}
