//go:build conformance

package e2e

import (
	"context"
	"encoding/xml"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/podnet/podnet/e2e/image"
	"github.com/podnet/podnet/e2e/realnode"
)

// The suite's images, under the registries KUBE_TEST_REPO_LIST maps to
// localhost: names and tags are the ones e2e.test v1.36.3 asks for
// (e2e.test --list-images).
const (
	confRegistry      = "localhost/e2e-test-images"
	confGCRegistry    = "localhost/k8s"
	confBuildRegistry = "localhost/build-image"
)

// conformanceImages builds the images the [sig-network] specs run: the
// stand-ins of standIns (agnhost, busybox, distroless-iptables,
// regression-issue-74839, each with what the specs exec in it),
// glibc-dns-testing (Debian with dnsutils), nginx (has only to keep
// serving: the test app), and pause.
func conformanceImages(t *testing.T, dir, agnhost, coredns, testapp string) []string {
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
		{confRegistry + "/glibc-dns-testing:2.0.0", image.Spec{Suite: "bookworm", Packages: []string{"bind9-dnsutils"},
			Entrypoint: []string{"/bin/sh"}}},
		{confRegistry + "/nginx:1.15-4", image.Spec{Files: []image.File{{Src: testapp, Dst: "/testapp", Mode: 0o755}},
			Entrypoint: []string{"/testapp", "serve", ":80"}}},
		{confGCRegistry + "/pause:3.10.2", image.Spec{Files: []image.File{{Src: testapp, Dst: "/testapp", Mode: 0o755}},
			Entrypoint: []string{"/testapp", "pause"}}},
	}
	for _, si := range standIns(agnhost, coredns, filepath.Join(certDir, "localhost.crt"), filepath.Join(certDir, "localhost.key"), buildRegression74839(t, dir)) {
		specs = append(specs, struct {
			tag  string
			spec image.Spec
		}{si.tag, si.spec})
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

// buildRegression74839 builds the conntrack spec's "boom-server" from the
// tools module (e2e.test's release) into dir.
func buildRegression74839(t *testing.T, dir string) string {
	t.Helper()
	bin := filepath.Join(dir, "regression-issue-74839")
	if out, err := goCmd("-C", "apiserver/tools", "build", "-trimpath", "-o", bin, "k8s.io/kubernetes/test/images/regression-issue-74839"); err != nil {
		t.Fatalf("build regression-issue-74839: %v\n%s", err, out)
	}
	return bin
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

// confLab is one kind of lab TestConformance can run e2e.test against:
// the column its results go under, and how its cluster is started.
type confLab struct {
	column  string
	options func(e confLabEnv) realClusterOptions
}

// confLabEnv is what every lab kind's options are built from.
type confLabEnv struct {
	run conformanceRun
	// images are the specs' images; baselineImages adds CoreDNS's.
	images, baselineImages []string
}

// confLabs are the lab kinds, by the name PODNET_CONFORMANCE_LABS (make's
// CONFORMANCE_LABS) chooses them with. Other files add kinds in init.
var confLabs = map[string]confLab{
	// podnet as README installs it (deploy/: iptables mode).
	"podnet": {column: "podnet", options: podnetVariantLab("")},
	// podnet from deploy/ebpf and deploy/nftables.
	"podnet-ebpf":     {column: "podnet ebpf", options: podnetVariantLab("ebpf")},
	"podnet-nftables": {column: "podnet nftables", options: podnetVariantLab("nftables")},
	// podnet's CNI plugin and node agent (proxy mode none) with kube-proxy
	// (iptables) and CoreDNS of the same release for Services and DNS.
	"baseline": {column: "kube-proxy+CoreDNS", options: func(e confLabEnv) realClusterOptions {
		return realClusterOptions{
			extraImages: func(*realCluster) []string { return e.baselineImages },
			users:       map[string]string{kubeProxyUser: "system:authenticated"},
			install:     installBaseline(e.run.kubeProxy),
		}
	}},
}

// podnetVariantLab is podnet installed from a variant of deploy/ ("" for
// deploy/ itself).
func podnetVariantLab(variant string) func(e confLabEnv) realClusterOptions {
	return func(e confLabEnv) realClusterOptions {
		return realClusterOptions{variant: variant, extraImages: func(*realCluster) []string { return e.images }}
	}
}

// defaultConfLabs is what a run without PODNET_CONFORMANCE_LABS compares.
const defaultConfLabs = "podnet baseline"

// parseConfLabs is the lab kinds a PODNET_CONFORMANCE_LABS value names
// (space- or comma-separated, each once), in its order.
func parseConfLabs(v string) ([]string, error) {
	if strings.TrimSpace(v) == "" {
		v = defaultConfLabs
	}
	var names []string
	seen := map[string]bool{}
	for _, n := range strings.FieldsFunc(v, func(r rune) bool { return r == ' ' || r == ',' }) {
		if _, ok := confLabs[n]; !ok {
			known := make([]string, 0, len(confLabs))
			for k := range confLabs {
				known = append(known, k)
			}
			sort.Strings(known)
			return nil, fmt.Errorf("lab %q: not a lab kind (%s)", n, strings.Join(known, ", "))
		}
		if seen[n] {
			return nil, fmt.Errorf("lab %q named twice", n)
		}
		seen[n] = true
		names = append(names, n)
	}
	return names, nil
}

// TestConformance runs e2e.test's [sig-network] specs (by default the
// [Conformance] ones) against the labs PODNET_CONFORMANCE_LABS names (by
// default podnet as README installs it and the baseline), each of three
// real nodes (two on one segment, one across the router). e2e.test runs
// under the ginkgo CLI with parallel processes, as upstream CI runs specs
// that are not [Serial] (ginkgo itself runs the [Serial] ones after the
// others, one at a time, when the skip lets them in). The labs run at the
// same time, or one after the other with PODNET_CONFORMANCE_ONE_LAB=1 (each
// then has the whole budget). It prints passed / failed / skipped per spec
// for every lab side by side, and fails if a lab fails any. make
// conformance runs it.
func TestConformance(t *testing.T) {
	r := conformanceRunFromEnv(t)
	labs, err := parseConfLabs(os.Getenv("PODNET_CONFORMANCE_LABS"))
	if err != nil {
		t.Fatalf("PODNET_CONFORMANCE_LABS: %v", err)
	}
	oneLab := os.Getenv("PODNET_CONFORMANCE_ONE_LAB") != ""
	checkCoreDNSVersion(t, r.coredns)
	checkGinkgoVersion(t, r.ginkgo)
	dir := t.TempDir()
	images := conformanceImages(t, dir, r.agnhost, r.coredns, buildTestapp(t, dir))
	env := confLabEnv{run: r, images: images, baselineImages: append([]string{corednsImageTar(t, dir, r.coredns)}, images...)}

	results := make([]map[string]specResult, len(labs))
	t.Run("labs", func(t *testing.T) {
		for i, name := range labs {
			t.Run(name, func(t *testing.T) {
				if !oneLab {
					t.Parallel()
				}
				c := startRealClusterOpts(t, realNodes(), confLabs[name].options(env))
				results[i] = c.runConformance(t, r)
			})
		}
	})
	columns := make([]string, len(labs))
	for i, name := range labs {
		columns[i] = confLabs[name].column
	}
	t.Logf("%s", compareTable(columns, results))
}

// conformanceRun is what make conformance hands TestConformance.
type conformanceRun struct {
	e2eTest, agnhost, kubeProxy, coredns, ginkgo string
	focus, skip                                  string
	// procs is the ginkgo CLI's parallel processes (--procs).
	procs int
	// budget is one lab's e2e.test run at most; 0: until go test's
	// deadline.
	budget time.Duration
}

func conformanceRunFromEnv(t *testing.T) conformanceRun {
	t.Helper()
	r := conformanceRun{
		e2eTest: os.Getenv("PODNET_E2E_TEST"), agnhost: os.Getenv("PODNET_AGNHOST"),
		kubeProxy: os.Getenv("PODNET_KUBE_PROXY"), coredns: os.Getenv("PODNET_COREDNS"), ginkgo: os.Getenv("PODNET_GINKGO"),
		focus: os.Getenv("PODNET_CONFORMANCE_FOCUS"), skip: os.Getenv("PODNET_CONFORMANCE_SKIP"), procs: 4,
	}
	if r.e2eTest == "" || r.agnhost == "" || r.kubeProxy == "" || r.coredns == "" || r.ginkgo == "" {
		t.Fatal("$PODNET_E2E_TEST, $PODNET_AGNHOST, $PODNET_KUBE_PROXY, $PODNET_COREDNS or $PODNET_GINKGO is unset: run make conformance")
	}
	if r.focus == "" {
		r.focus = `\[sig-network\].*\[Conformance\]`
	}
	if r.skip == "" {
		r.skip = `\[Serial\]|\[Disruptive\]`
	}
	for _, re := range []string{r.focus, r.skip} {
		if _, err := regexp.Compile(re); err != nil {
			t.Fatalf("PODNET_CONFORMANCE_FOCUS or _SKIP %q: %v", re, err)
		}
	}
	if v := os.Getenv("PODNET_CONFORMANCE_PROCS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("PODNET_CONFORMANCE_PROCS %q: want a count of processes, 1 or more", v)
		}
		r.procs = n
	}
	if v := os.Getenv("PODNET_CONFORMANCE_BUDGET"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("PODNET_CONFORMANCE_BUDGET %q: want a duration such as 50m", v)
		}
		r.budget = d
	}
	return r
}

// checkGinkgoVersion fails unless the ginkgo CLI is the version e2e.test
// was built with (the tools module's): the CLI and the suite's processes
// speak a protocol of that version.
func checkGinkgoVersion(t *testing.T, ginkgo string) {
	t.Helper()
	want, err := goCmd("-C", "apiserver/tools", "list", "-m", "-f", "{{.Version}}", "github.com/onsi/ginkgo/v2")
	if err != nil {
		t.Fatalf("go list -m github.com/onsi/ginkgo/v2: %v\n%s", err, want)
	}
	want = strings.TrimPrefix(strings.TrimSpace(want), "v")
	out, err := exec.Command(ginkgo, "version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Version "+want) {
		t.Fatalf("%s version: %q, %v; e2e.test %s is built with ginkgo %s", ginkgo, out, err, realnode.Version, want)
	}
}

// runConformance runs e2e.test against the cluster, logs its table, and
// fails the test if a spec failed or none passed.
func (c *realCluster) runConformance(t *testing.T, r conformanceRun) map[string]specResult {
	dir := t.TempDir()
	repoList := filepath.Join(dir, "repo-list.yaml")
	if err := os.WriteFile(repoList, []byte(fmt.Sprintf("promoterE2eRegistry: %s\ngcRegistry: %s\nbuildImageRegistry: %s\nsigStorageRegistry: localhost/sig-storage\ngcEtcdRegistry: %s\ndockerLibraryRegistry: localhost/library\n", confRegistry, confGCRegistry, confBuildRegistry, confGCRegistry)), 0o644); err != nil {
		t.Fatal(err)
	}
	// The ginkgo CLI takes a precompiled suite by its name's .test suffix.
	suite := filepath.Join(dir, "e2e.test")
	if err := os.Symlink(r.e2eTest, suite); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report")
	// Every spec's steps and logs, passed or not (to explain a difference).
	verbose := os.Getenv("PODNET_CONFORMANCE_VERBOSE") != ""
	budget := conformanceBudget(t, r.budget)
	ctx, cancel := context.WithTimeout(t.Context(), budget+2*time.Minute)
	defer cancel()
	start := time.Now()
	args := []string{"env", "KUBE_TEST_REPO_LIST=" + repoList, r.ginkgo,
		"--procs=" + strconv.Itoa(r.procs), "--focus=" + r.focus, "--skip=" + r.skip,
		"--timeout=" + budget.Round(time.Second).String(), "--no-color", "--v=" + strconv.FormatBool(verbose),
		suite, "--",
		"--kubeconfig=" + c.adminKC, "--provider=local", "--kubectl-path=" + c.bins.Kubectl,
		"--report-dir=" + report, "--allowed-not-ready-nodes=0", "--system-pods-startup-timeout=2m",
		"--non-blocking-taints=node-role.kubernetes.io/control-plane",
	}
	out, err := c.cp.Host.Exec(ctx, args...)
	tail := 80
	if verbose {
		tail = 2000
	}
	t.Logf("e2e.test (%d ginkgo processes) ran %v: %v\n%s", r.procs, time.Since(start).Round(time.Second), err, tailLines(out, tail))
	results := readJUnit(t, report, regexp.MustCompile(r.focus))
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

// conformanceBudget is how long the suite may run: want (0: no limit of
// its own), or less so that it stops itself (and writes its report) before
// go test's deadline would kill it.
func conformanceBudget(t *testing.T, want time.Duration) time.Duration {
	d, ok := t.Deadline()
	switch {
	case !ok && want == 0:
		return 120 * time.Minute
	case !ok:
		return want
	}
	left := max(time.Until(d)-3*time.Minute, time.Minute)
	if want == 0 || left < want {
		return left
	}
	return want
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

// compareTable is every lab's results side by side (columns[i] heading
// results[i]), the specs whose outcome is not the same in all of them
// listed after the table.
func compareTable(columns []string, results []map[string]specResult) string {
	names := map[string]bool{}
	for _, res := range results {
		for n := range res {
			names[n] = true
		}
	}
	sorted := make([]string, 0, len(names))
	for n := range names {
		sorted = append(sorted, n)
	}
	sort.Strings(sorted)
	var b strings.Builder
	fmt.Fprintf(&b, "| test | %s |\n|---%s|\n", strings.Join(columns, " | "), strings.Repeat("|---", len(columns)))
	var diffs []string
	sum := make([]map[string]int, len(columns))
	for _, n := range sorted {
		cells := make([]string, len(columns))
		first, differ := "", false
		for i := range columns {
			if sum[i] == nil {
				sum[i] = map[string]int{}
			}
			st, secs := "not run", 0.0
			if r, ok := results[i][n]; ok {
				st, secs = r.state, r.secs
			}
			sum[i][st]++
			cells[i] = fmt.Sprintf("%s (%.0f s)", st, secs)
			if i == 0 {
				first = st
			}
			differ = differ || st != first
		}
		fmt.Fprintf(&b, "| %s | %s |\n", n, strings.Join(cells, " | "))
		if differ {
			diffs = append(diffs, n)
		}
	}
	for i, col := range columns {
		s := sum[i]
		fmt.Fprintf(&b, "%s: %d passed, %d failed, %d skipped, %d not run\n", col, s["passed"], s["FAILED"], s["skipped"], s["not run"])
	}
	fmt.Fprintf(&b, "%d specs differ:\n%s\n", len(diffs), strings.Join(diffs, "\n"))
	return b.String()
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
