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
	"strings"
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
// [Conformance] tests run: agnhost (the tests use /bin/sh, curl, nc, dig,
// getent beside it, so a Debian root with those tools), glibc-dns-testing
// (Debian with dnsutils), nginx (has only to keep serving: the test app),
// and pause.
func (c *realCluster) conformanceImages(dir, agnhost, testapp string) []string {
	c.t.Helper()
	certDir := filepath.Join(dir, "certs")
	if err := os.MkdirAll(certDir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	// agnhost's Proxy tests serve TLS with the pair the upstream image ships.
	for _, f := range []string{"localhost.crt", "localhost.key"} {
		src := filepath.Join(moduleDir(c.t, "k8s.io/kubernetes"), "test/images/agnhost/porter", f)
		data, err := os.ReadFile(src)
		if err != nil {
			c.t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(certDir, f), data, 0o644); err != nil {
			c.t.Fatal(err)
		}
	}
	debianTools := []string{"bind9-dnsutils", "curl", "netcat-openbsd", "iproute2", "iputils-ping", "procps"}
	specs := []struct {
		tag  string
		spec image.Spec
	}{
		{confRegistry + "/agnhost:2.63.0", image.Spec{Suite: "bookworm", Packages: debianTools,
			Files: []image.File{{Src: agnhost, Dst: "/agnhost", Mode: 0o755},
				{Src: filepath.Join(certDir, "localhost.crt"), Dst: "/localhost.crt"},
				{Src: filepath.Join(certDir, "localhost.key"), Dst: "/localhost.key"}},
			// As upstream's: with no arguments it pauses (host-exec pods).
			Entrypoint: []string{"/agnhost"}, Cmd: []string{"pause"}}},
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
		if err := image.Build(c.t.Context(), image.BuildOptions{Spec: s.spec, Tag: s.tag, Out: p, CacheDir: "/var/cache/podnet"}); err != nil {
			c.t.Fatalf("image %s: %v", s.tag, err)
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

// TestConformance runs e2e.test's [sig-network] [Conformance] specs against
// three real nodes (two on one segment, one across the router) running
// podnet as README installs it, and prints passed / failed / skipped per
// spec. make conformance runs it.
func TestConformance(t *testing.T) {
	e2eTest, agnhost := os.Getenv("PODNET_E2E_TEST"), os.Getenv("PODNET_AGNHOST")
	if e2eTest == "" || agnhost == "" {
		t.Fatal("$PODNET_E2E_TEST and $PODNET_AGNHOST are unset: run make conformance")
	}
	focus := os.Getenv("PODNET_CONFORMANCE_FOCUS")
	if focus == "" {
		focus = `\[sig-network\].*\[Conformance\]`
	}
	dir := t.TempDir()
	extra := func(c *realCluster) []string { return c.conformanceImages(dir, agnhost, c.testapp) }
	c := startRealClusterWith(t, realNodes(), extra)

	repoList := filepath.Join(dir, "repo-list.yaml")
	if err := os.WriteFile(repoList, []byte(fmt.Sprintf("promoterE2eRegistry: %s\ngcRegistry: %s\nbuildImageRegistry: localhost/build-image\nsigStorageRegistry: localhost/sig-storage\ngcEtcdRegistry: %s\ndockerLibraryRegistry: localhost/library\n", confRegistry, confGCRegistry, confGCRegistry)), 0o644); err != nil {
		t.Fatal(err)
	}
	report := filepath.Join(dir, "report")
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
		"--ginkgo.timeout="+budget.Round(time.Second).String(), "--ginkgo.no-color", "--ginkgo.v=false",
		"--report-dir="+report, "--allowed-not-ready-nodes=0", "--system-pods-startup-timeout=2m",
		"--non-blocking-taints=node-role.kubernetes.io/control-plane",
	)
	t.Logf("e2e.test ran %v: %v\n%s", time.Since(start).Round(time.Second), err, tailLines(out, 80))
	junits, _ := filepath.Glob(filepath.Join(report, "junit*.xml"))
	if len(junits) == 0 {
		t.Fatalf("no junit report in %s", report)
	}
	focusRE := regexp.MustCompile(focus)
	var rows []string
	passed, failed, skipped := 0, 0, 0
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
				// The report lists every spec; the table, the focused ones.
				if !focusRE.MatchString(tc.Name) {
					continue
				}
				state := "passed"
				switch {
				case tc.Failure != nil:
					state, failed = "FAILED", failed+1
				case tc.Skipped != nil:
					state, skipped = "skipped", skipped+1
				default:
					passed++
				}
				rows = append(rows, fmt.Sprintf("| %s | %s | %.0f s |", tc.Name, state, tc.Time))
			}
		}
	}
	sort.Strings(rows)
	t.Logf("conformance: %d passed, %d failed, %d skipped\n| test | result | time |\n|---|---|---|\n%s", passed, failed, skipped, strings.Join(rows, "\n"))
	if failed > 0 || passed == 0 {
		t.Errorf("%d conformance tests failed, %d passed", failed, passed)
	}
}

func tailLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
