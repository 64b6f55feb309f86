package e2e

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"testing"

	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// kustomizeBuild builds dir as kubectl apply -k does (kubectl kustomize)
// and returns its objects as decoded documents.
func kustomizeBuild(t *testing.T, kubectl, dir string) []map[string]any {
	t.Helper()
	out, err := exec.Command(kubectl, "kustomize", dir).CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v\n%s", dir, err, out)
	}
	var docs []map[string]any
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return docs
		} else if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		docs = append(docs, doc)
	}
}

// findObject is the document of kind and name among docs, or nil.
func findObject(docs []map[string]any, kind, name string) map[string]any {
	for _, d := range docs {
		if md, _ := d["metadata"].(map[string]any); d["kind"] == kind && md["name"] == name {
			return d
		}
	}
	return nil
}
