package nodeconfig

import (
	"encoding/json"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
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
	if !reflect.DeepEqual(got, want) {
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
		{`{"podCIDR":"fd00:10:244:1::/127"}`, "too small for pods (need /126"},
		{`{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","10.244.2.0/24"]}`, "both IPv4; want one per family"},
		{`{"podCIDR":"10.244.1.0/24","podCIDRs":["fd00:10:244:1::/64"]}`, "does not hold 10.244.1.0/24"},
		{`{"podCIDR":"fd00:10:244:1::/64","podCIDRs":["10.244.1.0/24","fd00:10:244:1::/64"]}`, "podCIDR is the IPv4 one"},
		{`{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","fd00:1::/64"],"clusterCIDRs":["10.244.0.0/16","fd00:10:244::/56"],"clusterCIDR":"10.244.0.0/16"}`, "fd00:1::/64 is outside clusterCIDR fd00:10:244::/56"},
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

// TestDualStackForOldAndNewReaders: a dual-stack node's file holds both
// podCIDRs for this release's plugin, and podCIDR (the IPv4 one) for a
// plugin of the release before, which knew no other field; a single-stack
// node writes exactly the file that release wrote.
func TestDualStackForOldAndNewReaders(t *testing.T) {
	v4, v6 := netip.MustParsePrefix("10.244.1.0/24"), netip.MustParsePrefix("fd00:10:244:1::/64")
	c4, c6 := netip.MustParsePrefix("10.244.0.0/16"), netip.MustParsePrefix("fd00:10:244::/56")
	path := filepath.Join(t.TempDir(), "node.json")
	// The IPv6 one first, as a Node may list them: podCIDR is still IPv4's.
	if err := Write(path, New([]netip.Prefix{v6, v4}, []netip.Prefix{c6, c4}, 1450)); err != nil {
		t.Fatal(err)
	}
	got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.PodCIDR != v4 || got.ClusterCIDR != c4 || !reflect.DeepEqual(got.Pods(), []netip.Prefix{v6, v4}) {
		t.Errorf("read %+v", got)
	}
	data, _ := os.ReadFile(path)
	var old struct {
		PodCIDR     string `json:"podCIDR"`
		ClusterCIDR string `json:"clusterCIDR"`
		MTU         int    `json:"mtu"`
	}
	if err := json.Unmarshal(data, &old); err != nil || old.PodCIDR != "10.244.1.0/24" || old.ClusterCIDR != "10.244.0.0/16" || old.MTU != 1450 {
		t.Errorf("an older reader sees %+v (%v) in %s", old, err, data)
	}

	for _, c := range []struct {
		pods, clusters []netip.Prefix
		want           string
	}{
		{[]netip.Prefix{v4}, []netip.Prefix{c4}, `{"podCIDR":"10.244.1.0/24","clusterCIDR":"10.244.0.0/16","mtu":1450}`},
		{[]netip.Prefix{v6}, []netip.Prefix{c6}, `{"podCIDR":"fd00:10:244:1::/64","clusterCIDR":"fd00:10:244::/56","mtu":1450}`},
	} {
		data, err := json.Marshal(New(c.pods, c.clusters, 1450))
		if err != nil || string(data) != c.want {
			t.Errorf("single stack %v: %s (%v), want %s", c.pods, data, err, c.want)
		}
	}
}
