package proxy

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
)

// modeLog records what the fake modes were asked to do, in order.
type modeLog struct {
	mu    sync.Mutex
	steps []string
}

func (l *modeLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.steps = append(l.steps, s)
}

func (l *modeLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.steps)
}

// closingBackend is a fakeBackend that records Close.
type closingBackend struct {
	*fakeBackend
	log *modeLog
}

func (b closingBackend) Close() error { b.log.add("close"); return nil }

func fakeMode(name string, log *modeLog, probe error, b Backend) Mode {
	return Mode{
		Name:    name,
		Probe:   func(Config) error { log.add("probe " + name); return probe },
		New:     func(Config) (Backend, error) { log.add("new " + name); return b, nil },
		Cleanup: func(Config) error { log.add("cleanup " + name); return nil },
	}
}

func TestModesSelect(t *testing.T) {
	var log modeLog
	missing := errors.New("program type cgroup_sock_addr not supported")
	ms := Modes{fakeMode("a", &log, nil, nil), fakeMode("b", &log, missing, nil), None}

	m, err := ms.Select("a", Config{})
	if err != nil || m.Name != "a" {
		t.Fatalf("Select(a) = %q, %v", m.Name, err)
	}
	_, err = ms.Select("b", Config{})
	if !errors.Is(err, missing) || !strings.Contains(err.Error(), "--proxy-mode b") {
		t.Errorf("Select(b) with a failing probe: err = %v, want one naming the flag, the mode and the missing piece", err)
	}
	_, err = ms.Select("c", Config{})
	if err == nil || !strings.Contains(err.Error(), `"c" is not a, b, none`) {
		t.Errorf("Select(c): err = %v, want one listing the modes", err)
	}
	if got, want := log.get(), []string{"probe a", "probe b"}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q: only probes, nothing cleaned or built", got, want)
	}
	if _, err := ms.Select("none", Config{}); err != nil {
		t.Errorf("Select(none): %v", err)
	}
}

func TestModesCleanup(t *testing.T) {
	var log modeLog
	ms := Modes{fakeMode("a", &log, nil, nil), None, fakeMode("b", &log, nil, nil)}
	ms[2].Cleanup = func(Config) error { log.add("cleanup b"); return errors.New("busy") }
	err := ms.Cleanup(Config{}, "a")
	if err == nil || !strings.Contains(err.Error(), "remove b mode's state: busy") {
		t.Errorf("err = %v, want the failing mode named", err)
	}
	if got, want := log.get(), []string{"cleanup b"}; !slices.Equal(got, want) {
		t.Errorf("Cleanup keeping a: steps %q, want %q", got, want)
	}
	if err := (Modes{fakeMode("a", &log, nil, nil)}).Cleanup(Config{}, ""); err != nil {
		t.Fatal(err)
	}
	if got := log.get(); got[len(got)-1] != "cleanup a" {
		t.Errorf("Cleanup keeping nothing did not clean a: %q", got)
	}
}

// TestRunServiceSwitchesModes: starting mode a builds a's backend, syncs
// it, removes b's state only then (so Services are served throughout the
// switch), and closes a's backend at the end.
func TestRunServiceSwitchesModes(t *testing.T) {
	var log modeLog
	fb := &fakeBackend{sig: make(chan struct{}, 1)}
	a := fakeMode("a", &log, nil, closingBackend{fb, &log})
	ms := Modes{a, fakeMode("b", &log, nil, nil)}
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(0))
	st.MarkSynced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- RunService(ctx, ServiceOptions{Mode: a, Modes: ms, Config: Config{NodeName: "n1"}, SyncPeriod: time.Hour, MinSyncPeriod: time.Millisecond}, Env{Store: st})
	}()
	if c := fb.wait(t, 1); !c[0].full || c[0].ports != 1 {
		t.Errorf("first sync %+v, want a full one of 1 Service", c[0])
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := log.get(), []string{"new a", "cleanup b", "close"}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
}

// TestRunServiceNone: mode none removes the other modes' state and then
// programs nothing until ctx ends.
func TestRunServiceNone(t *testing.T) {
	var log modeLog
	ms := Modes{fakeMode("a", &log, nil, nil), None}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := RunService(ctx, ServiceOptions{Mode: None, Modes: ms}, Env{Store: cluster.NewStore()}); err != nil {
		t.Fatal(err)
	}
	if got, want := log.get(), []string{"cleanup a"}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
}

// TestRunServiceTakesOver: kube-proxy's state (TakeOver) is removed only
// once this proxy's first sync has put its own rules in, with the other
// modes' state, and once.
func TestRunServiceTakesOver(t *testing.T) {
	var log modeLog
	fb := &fakeBackend{sig: make(chan struct{}, 1)}
	a := fakeMode("a", &log, nil, fb)
	ms := Modes{a, fakeMode("b", &log, nil, nil)}
	st := cluster.NewStore()
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(0))
	st.MarkSynced()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	takeOver := func() error { log.add("take over"); return nil }
	go func() {
		done <- RunService(ctx, ServiceOptions{Mode: a, Modes: ms, Config: Config{NodeName: "n1"}, SyncPeriod: time.Hour, MinSyncPeriod: time.Millisecond, TakeOver: takeOver}, Env{Store: st})
	}()
	fb.wait(t, 1)
	st.Replace([]cluster.Kind{cluster.KindService, cluster.KindEndpointSlice}, svcObjs(1))
	fb.wait(t, 2)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := log.get(), []string{"new a", "cleanup b", "take over"}; !slices.Equal(got, want) {
		t.Errorf("steps %q, want %q", got, want)
	}
}
