package atomicfile

import (
	"os"
	"path/filepath"
	"testing"
)

func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "a", "b", "f.json")
	for _, c := range []struct {
		data string
		perm os.FileMode
	}{{"one", 0o644}, {"two", 0o600}} {
		if err := WriteFile(path, []byte(c.data), c.perm); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != c.data {
			t.Fatalf("read %q, %v; want %q", got, err, c.data)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != c.perm {
			t.Fatalf("mode %v, want %v", fi.Mode().Perm(), c.perm)
		}
	}
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("temporary files left beside the file: %d entries", len(entries))
	}
}

func TestReplaceFailsWithoutDirectory(t *testing.T) {
	if err := Replace(filepath.Join(t.TempDir(), "missing", "f"), []byte("x"), 0o644); err == nil {
		t.Fatal("Replace into a missing directory succeeded")
	}
}
