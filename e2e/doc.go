// Package e2e holds the end-to-end tests: each test builds a cluster in
// network namespaces on this machine with the lab (package e2e/lab), runs the
// real binaries in it (the CNI plugin through libcni, proxyd, dnsd) and checks
// packets, not internal state.
//
// The tests need root and the binaries that `make build` puts into bin/;
// `make test` runs them with PODNET_BIN pointing there. Run one package at a
// time (-p 1): the lab is fast (a four-node lab builds in well under 200 ms),
// but the machine has two cores.
//
// A test reads like this:
//
//	roottest.Require(t)
//	l := lab.Start(t, lab.Options{})          // removed again when the test ends
//	for _, n := range l.Nodes {
//		n.StartProxyd(ctx, "--proxy-mode", "iptables") // returns once node.json is written
//	}
//	web, _ := l.Node("node2").AddPod(ctx, "web")   // the real CNI plugin, via libcni
//	web.StartEcho(lab.EchoOptions{HTTP: []string{":8080"}})
//	l.WriteState("web.yaml", serviceAndEndpointSliceYAML) // the control plane
//	client, _ := l.Node("node4").AddPod(ctx, "client")
//	answer, err := client.Probe(ctx, "http", "10.96.0.20:80") // "web 10.244.4.2:41234"
//	rtt, err := client.Ping(ctx, web.IP)
//	out, err := client.Exec(ctx, "dig", "@10.96.0.10", "kubernetes.default.svc.cluster.local")
//
// Processes started with Start or Exec run inside the namespace and in the
// node's cgroup v2 (so per-node eBPF socket hooks see them); Probe and the
// echo server are real processes too (`podnet-lab probe`/`serve`). Ping and
// the lab's own helpers run in the test process, inside the namespace but
// not inside the node's cgroup. The outside namespace (l.OutsideHost,
// 203.0.113.10) stands for the internet: an external client, or an upstream
// DNS server for dnsd. On failure, lab.Start logs every process's output and
// each node's cni.log.
package e2e
