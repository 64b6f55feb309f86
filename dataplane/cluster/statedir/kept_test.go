package statedir

import (
	"bytes"
	"testing"
)

func TestKeptBytesHasPrefix(t *testing.T) {
	data := bytes.Repeat([]byte("---\nkind: Service\nmetadata: {name: a}\n"), 1000)
	k := keep(data)
	if k.n != len(data) || len(k.z) >= len(data)/10 {
		t.Fatalf("kept %d bytes deflated to %d, want length %d and under a tenth", k.n, len(k.z), len(data))
	}
	for _, tt := range []struct {
		name string
		p    []byte
		want bool
	}{
		{"empty", nil, true},
		{"start", data[:100], true},
		{"all", data, true},
		{"longer", append(bytes.Clone(data), 'x'), false},
		{"changed", append(bytes.Clone(data[:99]), 'x'), false},
	} {
		if got := k.hasPrefix(tt.p); got != tt.want {
			t.Errorf("%s: hasPrefix = %v, want %v", tt.name, got, tt.want)
		}
	}
}
