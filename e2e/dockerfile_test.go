package e2e

import (
	"debug/elf"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDockerfile checks what can be checked of the image without a Docker
// engine (none runs on the test machines): a multi-stage build on the Go
// release go.mod names, whose final stage copies the three binaries, which
// are static (no ELF interpreter, no shared libraries), and runs as a
// non-root user.
func TestDockerfile(t *testing.T) {
	text, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("../go.mod")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(text), "\n")

	var stages []string
	for _, l := range lines {
		if f := strings.Fields(l); len(f) >= 2 && strings.EqualFold(f[0], "FROM") {
			stages = append(stages, f[1])
		}
	}
	if len(stages) < 2 {
		t.Fatalf("want a multi-stage build, found stages %v", stages)
	}
	goVersion := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(string(gomod))
	if goVersion == nil || !strings.HasPrefix(stages[0], "golang:"+goVersion[1]) {
		t.Errorf("build stage %q does not use the Go release of go.mod (%v)", stages[0], goVersion)
	}
	if !strings.Contains(string(text), "CGO_ENABLED=0") {
		t.Error("the build stage does not build with CGO_ENABLED=0")
	}

	// Everything after the last FROM is the final stage.
	last := 0
	for i, l := range lines {
		if strings.HasPrefix(strings.ToUpper(strings.TrimSpace(l)), "FROM ") {
			last = i
		}
	}
	final := strings.Join(lines[last:], "\n")
	user := regexp.MustCompile(`(?m)^USER\s+(\S+)`).FindStringSubmatch(final)
	if user == nil || strings.HasPrefix(user[1], "0") || strings.HasPrefix(user[1], "root") {
		t.Errorf("final stage runs as %v, want a non-root USER", user)
	}
	copied := regexp.MustCompile(`/src/bin/(\w[\w-]*)`).FindAllStringSubmatch(final, -1)
	got := map[string]bool{}
	for _, m := range copied {
		got[m[1]] = true
	}
	for _, name := range []string{"podnet", "proxyd", "dnsd"} {
		if !got[name] {
			t.Errorf("final stage does not copy bin/%s", name)
			continue
		}
		pkg := map[string]string{"podnet": "../cmd/cni-plugin", "proxyd": "../cmd/proxyd", "dnsd": "../cmd/dnsd"}[name]
		assertStatic(t, commandBinary(t, name, pkg))
	}
}

func assertStatic(t *testing.T, path string) {
	t.Helper()
	f, err := elf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("%s is dynamically linked (has an ELF interpreter)", filepath.Base(path))
		}
	}
	if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
		t.Errorf("%s needs shared libraries %v", filepath.Base(path), libs)
	}
}
