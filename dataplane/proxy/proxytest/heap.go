package proxytest

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/proxy"
)

// SyncHeap shows what bounds proxyd's memory in a proxy mode: the Go heap
// of DualStackSize() Services × 10 endpoints, single- and dual-stack,
// through three full syncs of the Backend newBackend gives into a fresh
// namespace lab's node: the state alone, the live heap after the syncs
// (the state and what the Backend keeps), the largest live heap any
// garbage collection during the syncs found, and the largest heap of
// objects (live and not yet collected), sampled every millisecond. With
// GOGC=100 the runtime lets the heap grow to twice the live heap before
// it collects. It prints a table for BENCHMARKS.md.
func SyncHeap(b *testing.B, mode string, newBackend func(l *NetnsLab, dual bool) proxy.Backend) {
	n, _ := DualStackSize()
	fmt.Printf("| %s mode, %d Services × 10 per family | the state alone | live after the syncs | largest live heap during a full sync | largest heap of objects |\n|---|---|---|---|---|\n", mode, n)
	for _, dual := range []bool{false, true} {
		_, state := DualStackState(n, 10, dual)
		runtime.GC()
		base := heapSample("/gc/heap/live:bytes")
		l := NewNetnsLab(b, fmt.Sprintf("heap%s%v", mode[:2], dual))
		be := newBackend(l, dual)
		live, objs := heapPeaks(b, func() error {
			return l.Node.Do(func(ns.NetNS) error {
				for range 3 {
					if _, err := be.Sync(state.Ports, nil, true); err != nil {
						return err
					}
				}
				return nil
			})
		})
		runtime.GC()
		after := heapSample("/gc/heap/live:bytes")
		runtime.KeepAlive(be)
		runtime.KeepAlive(state)
		stack := map[bool]string{false: "single", true: "dual"}[dual]
		fmt.Printf("| %s | %d MiB | %d MiB | %d MiB | %d MiB |\n", stack, base>>20, after>>20, live>>20, objs>>20)
		b.ReportMetric(float64(live)/(1<<20), stack+"-peak-live-MiB")
	}
}

// heapPeaks runs f, sampling the live heap of the last collection and the
// heap's objects every millisecond, and returns their largest values.
func heapPeaks(b *testing.B, f func() error) (live, objs uint64) {
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			live = max(live, heapSample("/gc/heap/live:bytes"))
			objs = max(objs, heapSample("/memory/classes/heap/objects:bytes"))
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()
	err := f()
	close(stop)
	<-done
	if err != nil {
		b.Fatal(err)
	}
	return live, objs
}

func heapSample(name string) uint64 {
	s := []metrics.Sample{{Name: name}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
