package iptables_test

import (
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
	"github.com/podnet/podnet/dataplane/proxy/iptables"
)

func TestZZDump(t *testing.T) {
	if os.Getenv("DUMP") == "" {
		t.Skip()
	}
	st, state := benchState(10000, 10)
	g := iptables.NewGenerator(defaultCfg)
	start := time.Now()
	rs := g.Generate(state.Ports)
	t.Logf("generate %v", time.Since(start))
	start = time.Now()
	data := iptables.RestoreData(nil, rs, true)
	t.Logf("restoredata full %v", time.Since(start))
	os.WriteFile("/tmp/pn/full10k.txt", data, 0o644)
	key := cluster.Key{Namespace: "default", Name: fmt.Sprintf("s%05d", 5000)}
	s := st.Service(key)
	st.Upsert(slice(s, []cluster.EndpointPort{epPort("p80", cluster.TCP, 8080)}, ep{a("10.250.250.250"), "node-c", true}))
	start = time.Now()
	changed := state.Update(st, nodeName, map[cluster.Key]bool{key: true}, false)
	t.Logf("update %v", time.Since(start))
	start = time.Now()
	rs2 := g.Generate(state.Ports)
	t.Logf("generate cached %v", time.Since(start))
	start = time.Now()
	data = iptables.RestoreData(rs, rs2, false)
	t.Logf("restoredata partial %v (%d bytes) %d", time.Since(start), len(data), len(changed))
	os.WriteFile("/tmp/pn/part10k.txt", data, 0o644)
}
