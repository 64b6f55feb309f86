package roottest

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// childEnv makes TestHelperChild call the helper it names, in a child
// process of this test binary: a failed or skipped test cannot be watched
// from inside.
const childEnv = "PODNET_ROOTTEST_CHILD"

// TestHelperChild is the child's test; in the parent it does nothing.
func TestHelperChild(t *testing.T) {
	switch os.Getenv(childEnv) {
	case "":
		return
	case "tool":
		Tool(t, "podnet-no-such-tool", "podnet-no-such-package")
	case "optional":
		Optional(t, "set PODNET_BENCH=1")
	}
	t.Log("ran on")
}

func child(t *testing.T, what string, strict bool) (string, error) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.v", "-test.run", "^TestHelperChild$")
	cmd.Env = append(os.Environ(), childEnv+"="+what, StrictEnv+"=")
	if strict {
		cmd.Env = append(cmd.Env, StrictEnv+"=1")
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// TestStrictTurnsAMissingToolIntoAFailure: a missing tool skips, naming
// the package to install; under PODNET_STRICT=1 it fails with the same
// reason.
func TestStrictTurnsAMissingToolIntoAFailure(t *testing.T) {
	out, err := child(t, "tool", false)
	if err != nil || !strings.Contains(out, "--- SKIP: TestHelperChild") || !strings.Contains(out, "scripts/deps.sh installs podnet-no-such-package") {
		t.Errorf("not strict: %v\n%s\nwant a skip naming the package", err, out)
	}
	out, err = child(t, "tool", true)
	if err == nil || !strings.Contains(out, "--- FAIL: TestHelperChild") || !strings.Contains(out, "podnet-no-such-tool not installed") {
		t.Errorf("strict: %v\n%s\nwant a failure naming the tool", err, out)
	}
	if strings.Contains(out, "ran on") {
		t.Errorf("strict: the test went on after the missing tool:\n%s", out)
	}
}

// TestOptionalSkipsEvenWhenStrict: a benchmark's own switch is not a
// missing precondition.
func TestOptionalSkipsEvenWhenStrict(t *testing.T) {
	out, err := child(t, "optional", true)
	if err != nil || !strings.Contains(out, "--- SKIP: TestHelperChild") || strings.Contains(out, "ran on") {
		t.Errorf("strict: %v\n%s\nwant a skip", err, out)
	}
}
