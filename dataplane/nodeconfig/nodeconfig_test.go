package nodeconfig

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteThenRead(t *testing.T) {
	path := filepath.Join(t.TempDir(), "run", "node.json")
	want := Config{
		PodCIDR:     netip.MustParsePrefix("10.244.1.0/24"),
		ClusterCIDR: netip.MustParsePrefix("10.244.0.0/16"),
		MTU:         1450,
	}
	if _, err := Read(path); !errors.Is(err, ErrNotFound) {
		t.Fatalf("before write: want ErrNotFound, got %v", err)
	}
	if err := Write(path, want); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("read %+v, wrote %+v", got, want)
	}
	// No temporary files are left beside it.
	entries, _ := os.ReadDir(filepath.Dir(path))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries, want only node.json", len(entries))
	}
}

func TestReadIgnoresUnknownFields(t *testing.T) {
	path := filepath.Join(t.TempDir(), "node.json")
	os.WriteFile(path, []byte(`{"podCIDR":"10.244.3.0/24","mtu":1500,"future":{"x":1}}`), 0o644)
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.PodCIDR != netip.MustParsePrefix("10.244.3.0/24") || got.MTU != 1500 {
		t.Fatalf("got %+v", got)
	}
}

func TestInvalidConfigNamesTheField(t *testing.T) {
	for _, c := range []struct {
		json, want string
	}{
		{`{}`, "podCIDR: missing"},
		{`{"podCIDR":"10.244.1.7/24"}`, "host bits"},
		{`{"podCIDR":"10.244.1.0/31"}`, "too small"},
		{`{"podCIDR":"10.1.0.0/24","clusterCIDR":"10.244.0.0/16"}`, "outside clusterCIDR"},
		{`{"podCIDR":"10.244.1.0/24","mtu":70000}`, "mtu: 70000"},
		{`{"podCIDR":"not-a-cidr"}`, "decode node config"},
	} {
		path := filepath.Join(t.TempDir(), "node.json")
		os.WriteFile(path, []byte(c.json), 0o644)
		_, err := Read(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: want an error naming %q and the path, got %v", c.json, c.want, err)
		}
	}
	if err := Write(filepath.Join(t.TempDir(), "x.json"), Config{}); err == nil {
		t.Error("Write accepted a config without podCIDR")
	}
}
