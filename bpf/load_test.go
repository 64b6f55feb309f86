package bpf

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"

	"github.com/podnet/podnet/dataplane/roottest"
)

// Every program of every object passes the verifier of the running kernel.
func TestObjectsLoad(t *testing.T) {
	roottest.Require(t)
	specs := map[string]func() (*ebpf.CollectionSpec, error){
		"sock":     LoadSock,
		"nodeport": LoadNodeport,
		"sockterm": LoadSockterm,
	}
	for name, load := range specs {
		t.Run(name, func(t *testing.T) {
			spec, err := load()
			if err != nil {
				t.Fatal(err)
			}
			if len(spec.Programs) == 0 {
				t.Fatal("object holds no programs")
			}
			coll, err := ebpf.NewCollection(spec)
			if err != nil {
				var ve *ebpf.VerifierError
				if errors.As(err, &ve) {
					t.Fatalf("verifier: %+v", ve)
				}
				t.Fatal(err)
			}
			defer coll.Close()
			for p := range spec.Programs {
				if coll.Programs[p] == nil {
					t.Errorf("program %s not loaded", p)
				}
			}
		})
	}
}
