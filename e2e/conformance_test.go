//go:build conformance

package e2e

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podnet/podnet/e2e/image"
)

// The suite's images, under the registries KUBE_TEST_REPO_LIST maps to
// localhost: names and tags are the ones e2e.test v1.36.3 asks for
// (e2e.test --list-images).
const (
	confRegistry   = "localhost/e2e-test-images"
	confGCRegistry = "localhost/k8s"
)

// conformanceImages builds the four images the [sig-network]
// [Conformance] tests run: agnhost (a Debian root with the tools the
// specs exec beside it, agnhostSpec), glibc-dns-testing
// (Debian with dnsutils), nginx (has only to keep serving: the test app),
// and pause.
func conformanceImages(t *testing.T, dir, agnhost, testapp string) []string {
	t.Helper()
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o755); err != nil {
		t.Fatal(err)
	}
	// agnhost's Proxy tests serve TLS with the pair the upstream image ships.
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		src := filepath.Join(moduleDir(t, "k8s.io/kubernetes"), "test/images/agnhost/porter", f)
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(certDir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	specs := []struct {
		tag  string
		spec image.Spec
	}{
		{confRegistry + "/agnhost:2.63.0", agnhostSpec(agnhost, filepath.Join(certDir, "localhost.crt"), filepath.Join(certDir, "localhost.key"))},
		{confRegistry + "/glibc-dns-testing:2.0.0", image.Spec{Suite: "bookworm", Packages: []string{"bind9-dnsutils"},
			Entrypoint: []string{"/bin/sh"}}},
		{confRegistry + "/nginx:1.15-4", image.Spec{Files: []image.File{{Src: testapp, Dst: "/testapp", Mode: 0o755}},
			Entrypoint: []string{"/testapp", "serve", ":80"}}},
		{confGCRegistry + "/pause:3.10.2", image.Spec{Files: []image.File{{Src: testapp, Dst: "/testapp", Mode: 0o755}},
			Entrypoint: []string{"/testapp", "pause"}}},
	}
	var out []string
	for _, s := range specs {
		p := filepath.Join(dir, strings.NewReplacer("/", "_", ":", "_").Replace(s.tag)+".tar")
		if err := image.Build(t.Context(), image.BuildOptions{Spec: s.spec, Tag: s.tag, Out: p, CacheDir: "/var/cache/podnet"}); err != nil {
			t.Fatalf("image %s: %v", s.tag, err)
		}
		out = append(out, p)
	}
	return out
}

// moduleDir is where the Go module cache holds mod (of the tools module).
func moduleDir(t *testing.T, mod string) string {
	t.Helper()
	out, err := goCmd("-C", "apiserver/tools", "list", "-m", "-f", "{{.Dir}}", mod)
	if err != nil {
		t.Fatalf("go list -m %s: %v\n%s", mod, err, out)
	}
	return strings.TrimSpace(out)
}

type junitSuite struct {
	Cases []struct {
		Name    string    `xml:"name,attr"`
		Time    float64   `xml:"time,attr"`
		Skipped *struct{} `xml:"skipped"`
		Failure *struct {
			Message string `xml:"message,attr"`
		} `xml:"failure"`
	} `xml:"testcase"`
}

// specResult is one spec's outcome in a junit report.
type specResult struct {
	state string // passed, FAILED or skipped
	secs  float64
}

// The two networks of the conformance run.
const (
	confPodnet   = "podnet"
	confBaseline = "kube-proxy+CoreDNS"
)

// TestConformance runs e2e.test's [sig-network] [Conformance] specs against
// two labs at once, each of three real nodes (two on one segment, one
// across the router): one running podnet as README installs it, the other
// the baseline, podnet's CNI plugin and node agent with kube-proxy
// (iptables) and CoreDNS of the same release serving Services and DNS. It
// prints passed / failed / skipped per spec for both side by side, and
// fails if podnet fails any. make conformance runs it.
func TestConformance(t *testing.T) {
	e2eTest, agnhost := os.Getenv("PODNET_E2E_TEST"), os.Getenv("PODNET_AGNHOST")
	kubeProxy, coredns := os.Getenv("PODNET_KUBE_PROXY"), os.Getenv("PODNET_COREDNS")
	if e2eTest == "" || agnhost == "" || kubeProxy == "" || coredns == "" {
		t.Fatal("$PODNET_E2E_TEST, $PODNET_AGNHOST, $PODNET_KUBE_PROXY or $PODNET_COREDNS is unset: run make conformance")
	}
	focus := os.Getenv("PODNET_CONFORMANCE_FOCUS")
	if focus == "" {
		focus = `\[sig-network\].*\[Conformance\]`
	}
	checkCoreDNSVersion(t, coredns)
	dir := t.TempDir()
	images := conformanceImages(t, dir, agnhost, buildTestapp(t, dir))
	baselineImages := append([]string{corednsImageTar(t, dir, coredns)}, images...)

	results := map[string]map[string]specResult{}
	var mu sync.Mutex
	run := func(t *testing.T, name string, o realClusterOptions) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			c := startRealClusterOpts(t, realNodes(), o)
			r := c.runConformance(t, e2eTest, focus)
			mu.Lock()
			results[name] = r
			mu.Unlock()
		})
	}
	t.Run("labs", func(t *testing.T) {
		run(t, confPodnet, realClusterOptions{extraImages: func(*realCluster) []string { return images }})
		run(t, confBaseline, realClusterOptions{
			extraImages: func(*realCluster) []string { return baselineImages },
			users:       map[string]string{kubeProxyUser: "system:authenticated"},
			install:     installBaseline(kubeProxy),
		})
	})
	t.Logf("%s", compareTable(results[confPodnet], results[confBaseline]))
}

// runConformance runs e2e.test against the cluster, logs its table, and
// fails the test if a spec failed or none passed.
func (c *realCluster) runConformance(t *testing.T, e2eTest, focus string) map[string]specResult {
	dir := t.TempDir()
	repoList := filepath.Join(dir, "repo-list.yaml")
	if err := os.WriteFile(repoList, []byte(fmt.Sprintf("promoterE2eRegistry: %s\ngcRegistry: %s\nbuildImageRegistry: localhost/build-image\nsigStorageRegistry: localhost/sig-storage\ngcEtcdRegistry: %s\ndockerLibraryRegistry: localhost/library\n", confRegistry, confGCRegistry, confGCRegistry)), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report")
	// Every spec's steps and logs, passed or not (to explain a difference).
	verbose := os.Getenv("PODNET_CONFORMANCE_VERBOSE") != ""
	// The suite stops itself (and writes its report) before go test's
	// deadline would kill it.
	budget := 120 * time.Minute
	if d, ok := t.Deadline(); ok {
		budget = time.Until(d) - 3*time.Minute
	}
	ctx, cancel := context.WithTimeout(t.Context(), budget+2*time.Minute)
	defer cancel()
	start := time.Now()
	out, err := c.cp.Host.Exec(ctx, "env", "KUBE_TEST_REPO_LIST="+repoList, e2eTest,
		"--kubeconfig="+c.adminKC, "--provider=local", "--kubectl-path="+c.bins.Kubectl,
		"--ginkgo.focus="+focus, "--ginkgo.skip=\\[Serial\\]|\\[Disruptive\\]",
		"--ginkgo.timeout="+budget.Round(time.Second).String(), "--ginkgo.no-color", "--ginkgo.v="+strconv.FormatBool(verbose),
		"--report-dir="+report, "--allowed-not-ready-nodes=0", "--system-pods-startup-timeout=2m",
		"--non-blocking-taints=node-role.kubernetes.io/control-plane",
	)
	tail := 80
	if verbose {
		tail = 2000
	}
	t.Logf("e2e.test ran %v: %v\n%s", time.Since(start).Round(time.Second), err, tailLines(out, tail))
	results := readJUnit(t, report, regexp.MustCompile(focus))
	var rows []string
	count := map[string]int{}
	for name, r := range results {
		count[r.state]++
		rows = append(rows, fmt.Sprintf("| %s | %s | %.0f s |", name, r.state, r.secs))
	}
	sort.Strings(rows)
	t.Logf("conformance: %d passed, %d failed, %d skipped\n| test | result | time |\n|---|---|---|\n%s", count["passed"], count["FAILED"], count["skipped"], strings.Join(rows, "\n"))
	if count["FAILED"] > 0 || count["passed"] == 0 {
		t.Errorf("%d conformance tests failed, %d passed", count["FAILED"], count["passed"])
	}
	return results
}

// readJUnit returns the outcome of every spec the focus matches in the
// junit reports of dir (the report lists every spec, run or not).
func readJUnit(t *testing.T, dir string, focus *regexp.Regexp) map[string]specResult {
	junits, _ := filepath.Glob(filepath.Join(dir, "junit*.xml"))
	if len(junits) == 0 {
		t.Fatalf("no junit report in %s", dir)
	}
	results := map[string]specResult{}
	for _, f := range junits {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var s struct {
			Suites []junitSuite `xml:"testsuite"`
		}
		if err := xml.Unmarshal(data, &s); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, suite := range s.Suites {
			for _, tc := range suite.Cases {
				if !focus.MatchString(tc.Name) {
					continue
				}
				r := specResult{state: "passed", secs: tc.Time}
				switch {
				case tc.Failure != nil:
					r.state = "FAILED"
				case tc.Skipped != nil:
					r.state = "skipped"
				}
				results[tc.Name] = r
			}
		}
	}
	return results
}

// compareTable is both runs' results side by side, the specs whose
// outcome differs listed after the table.
func compareTable(podnet, baseline map[string]specResult) string {
	names := map[string]bool{}
	for n := range podnet {
		names[n] = true
	}
	for n := range baseline {
		names[n] = true
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	state := func(r specResult, ok bool) string {
		if !ok {
			return "not run"
		}
		return r.state
	}
	var b strings.Builder
	fmt.Fprintf(&b, "| test | %s | %s |\n|---|---|---|\n", confPodnet, confBaseline)
	var diffs []string
	sum := map[string]map[string]int{confPodnet: {}, confBaseline: {}}
	for _, n := range sorted {
		p, pok := podnet[n]
		k, kok := baseline[n]
		ps, ks := state(p, pok), state(k, kok)
		sum[confPodnet][ps]++
		sum[confBaseline][ks]++
		fmt.Fprintf(&b, "| %s | %s (%.0f s) | %s (%.0f s) |\n", n, ps, p.secs, ks, k.secs)
		if ps != ks {
			diffs = append(diffs, n)
		}
	}
	for _, net := range []string{confPodnet, confBaseline} {
		s := sum[net]
		fmt.Fprintf(&b, "%s: %d passed, %d failed, %d skipped, %d not run\n", net, s["passed"], s["FAILED"], s["skipped"], s["not run"])
	}
	fmt.Fprintf(&b, "%d specs differ:\n%s\n", len(diffs), strings.Join(diffs, "\n"))
	return b.String()
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
