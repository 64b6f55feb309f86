package e2e

import (
	"os/exec"
	"testing"
)

// TestGoModTidy: go.mod and go.sum list exactly what the code imports, so a
// dependency dropped from the code (the conntrack CLI's replacement, say)
// leaves nothing behind, and a new import is not left as "indirect".
func TestGoModTidy(t *testing.T) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to check go.mod: %v", err)
	}
	cmd := exec.Command(gobin, "mod", "tidy", "-diff")
	cmd.Dir = ".."
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("go mod tidy would change go.mod or go.sum (%v); run it and commit the result:\n%s", err, out)
	}
}
