//go:build cnibench

package cni

// The CNI ADD/DEL benchmark (scripts/bench-cni.sh; never part of make test):
// podnet against the reference bridge + host-local plugins, same subnet and
// MTU, each in its own node namespace, driven through libcni like a runtime.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/podnet/podnet/dataplane/roottest"
)

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

type benchImpl struct {
	name   string
	plugin map[string]any
	path   []string
}

func TestBenchCNI(t *testing.T) {
	roottest.Require(t)
	seqN := envInt("BENCH_SEQ", 100)
	rounds := envInt("BENCH_ROUNDS", 10)
	const parallel = 20

	// The reference plugins at the version go.mod pins, built outside this
	// module (their extra dependencies are not in our go.sum).
	ver, err := exec.Command("go", "list", "-m", "-f", "{{.Version}}", "github.com/containernetworking/plugins").Output()
	if err != nil {
		t.Fatalf("find reference plugin version: %v", err)
	}
	refDir := t.TempDir()
	v := "@" + string(bytes.TrimSpace(ver))
	build := exec.Command("go", "install",
		"github.com/containernetworking/plugins/plugins/main/bridge"+v,
		"github.com/containernetworking/plugins/plugins/ipam/host-local"+v)
	build.Dir = refDir
	build.Env = append(os.Environ(), "GOBIN="+refDir, "GOFLAGS=")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build reference plugins: %v\n%s", err, out)
	}
	const subnet, mtu = "10.244.0.0/24", 1450
	impls := []func(dir string) benchImpl{
		func(dir string) benchImpl {
			return benchImpl{name: "podnet", path: []string{pluginDir(t)}, plugin: map[string]any{
				"type": "podnet", "subnet": subnet, "mtu": mtu,
				"dataDir": filepath.Join(dir, "ipam"), "logFile": filepath.Join(dir, "cni.log"),
			}}
		},
		func(dir string) benchImpl {
			return benchImpl{name: "bridge+host-local", path: []string{refDir}, plugin: map[string]any{
				"type": "bridge", "bridge": "cbr0", "isGateway": true, "mtu": mtu, "hairpinMode": true,
				"ipam": map[string]any{"type": "host-local", "subnet": subnet, "dataDir": filepath.Join(dir, "ipam")},
			}}
		},
	}

	type stats struct{ median, p99 time.Duration }
	results := map[string]map[string]stats{}
	record := func(impl, what string, d []time.Duration) {
		slices.Sort(d)
		if results[impl] == nil {
			results[impl] = map[string]stats{}
		}
		results[impl][what] = stats{median: d[len(d)/2], p99: d[min(len(d)-1, len(d)*99/100)]}
	}

	// Both set-ups exist side by side and the measurements alternate
	// between them, so load from anything else on the machine hits both.
	type setup struct {
		benchImpl
		node ns.NetNS
		list *libcni.NetworkConfigList
		c    *libcni.CNIConfig
		pods []ns.NetNS
	}
	var setups []*setup
	var podnetLog string
	for _, mk := range impls {
		dir := t.TempDir()
		s := &setup{benchImpl: mk(dir), node: newNetNS(t, "bnode")}
		if log, ok := s.plugin["logFile"].(string); ok {
			podnetLog = log
		}
		conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "bench", "plugins": []any{s.plugin}})
		if s.list, err = libcni.NetworkConfFromBytes(conf); err != nil {
			t.Fatal(err)
		}
		s.c = libcni.NewCNIConfigWithCacheDir(s.path, filepath.Join(dir, "cache"), newExec())
		for range parallel {
			s.pods = append(s.pods, newNetNS(t, "bpod"))
		}
		setups = append(setups, s)
	}
	op := func(s *setup, add bool, pod ns.NetNS, cid string) time.Duration {
		rc := &libcni.RuntimeConf{ContainerID: cid, NetNS: pod.Path(), IfName: "eth0"}
		var took time.Duration
		err := s.node.Do(func(ns.NetNS) error {
			start := time.Now()
			var err error
			if add {
				_, err = s.c.AddNetworkList(context.Background(), s.list, rc)
			} else {
				err = s.c.DelNetworkList(context.Background(), s.list, rc)
			}
			took = time.Since(start)
			return err
		})
		if err != nil {
			t.Errorf("%s add=%v %s: %v", s.name, add, cid, err)
		}
		return took
	}
	// Warm up: the first ADD creates the bridge.
	for _, s := range setups {
		op(s, true, s.pods[0], "warm")
		op(s, false, s.pods[0], "warm")
	}
	if t.Failed() {
		t.FailNow()
	}

	// Sequential: one ADD then its DEL, seqN times per implementation.
	adds, dels := map[string][]time.Duration{}, map[string][]time.Duration{}
	for i := range seqN {
		for _, s := range setups {
			cid := fmt.Sprintf("s%d", i)
			adds[s.name] = append(adds[s.name], op(s, true, s.pods[0], cid))
			dels[s.name] = append(dels[s.name], op(s, false, s.pods[0], cid))
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	for _, s := range setups {
		record(s.name, "ADD sequential", adds[s.name])
		record(s.name, "DEL sequential", dels[s.name])
	}

	// 20 at a time: 20 concurrent ADDs, then their 20 DELs, per round.
	adds, dels = map[string][]time.Duration{}, map[string][]time.Duration{}
	for r := range rounds {
		for _, s := range setups {
			for _, add := range []bool{true, false} {
				took := make([]time.Duration, parallel)
				var wg sync.WaitGroup
				for i := range parallel {
					wg.Go(func() { took[i] = op(s, add, s.pods[i], fmt.Sprintf("p%d-%d", r, i)) })
				}
				wg.Wait()
				if add {
					adds[s.name] = append(adds[s.name], took...)
				} else {
					dels[s.name] = append(dels[s.name], took...)
				}
			}
		}
		if t.Failed() {
			t.FailNow()
		}
	}
	for _, s := range setups {
		record(s.name, "ADD 20 at a time", adds[s.name])
		record(s.name, "DEL 20 at a time", dels[s.name])
	}

	ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
	fmt.Printf("\n| operation | podnet median | podnet p99 | bridge+host-local median | bridge+host-local p99 |\n|---|---|---|---|---|\n")
	for _, what := range []string{"ADD sequential", "DEL sequential", "ADD 20 at a time", "DEL 20 at a time"} {
		p, r := results["podnet"][what], results["bridge+host-local"][what]
		fmt.Printf("| %s | %s | %s | %s | %s |\n", what, ms(p.median), ms(p.p99), ms(r.median), ms(r.p99))
	}
	printPhases(podnetLog)
	fmt.Printf("\n(sequential: %d ADD+DEL pairs; 20 at a time: %d rounds of 20 concurrent ADDs, then their DELs; subnet %s, MTU %d)\n",
		seqN, rounds, subnet, mtu)
}

// printPhases summarises the per-step ADD timings podnet logs, to show
// where its time (and its tail) goes; sequential runs have container IDs
// starting with "s", concurrent ones with "p".
func printPhases(logFile string) {
	data, err := os.ReadFile(logFile)
	if err != nil {
		return
	}
	phases := map[string][]time.Duration{}
	for _, line := range strings.Split(string(data), "\n") {
		if !strings.Contains(line, "msg=attached") {
			continue
		}
		mode := ""
		for _, f := range strings.Fields(line) {
			k, v, ok := strings.Cut(f, "=")
			switch {
			case !ok:
			case k == "container" && strings.HasPrefix(v, "s"):
				mode = "sequential"
			case k == "container" && strings.HasPrefix(v, "p"):
				mode = "20 at a time"
			case k == "ipam" || k == "veth" || k == "pod":
				if d, err := time.ParseDuration(v); err == nil && mode != "" {
					phases[mode+" "+k] = append(phases[mode+" "+k], d)
				}
			}
		}
	}
	fmt.Printf("\npodnet ADD steps inside the plugin (ipam includes waiting for the store lock):\n\n| mode | step | median | p99 |\n|---|---|---|---|\n")
	for _, mode := range []string{"sequential", "20 at a time"} {
		for _, k := range []string{"ipam", "veth", "pod"} {
			d := phases[mode+" "+k]
			if len(d) == 0 {
				continue
			}
			slices.Sort(d)
			fmt.Printf("| %s | %s | %.2f ms | %.2f ms |\n", mode, k,
				float64(d[len(d)/2].Microseconds())/1000, float64(d[len(d)*99/100].Microseconds())/1000)
		}
	}
}
