package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/pflag"

	"github.com/podnet/podnet/dataplane/agent"
	"github.com/podnet/podnet/dataplane/policy"
	"github.com/podnet/podnet/dataplane/proxy"
	"github.com/podnet/podnet/dataplane/proxy/ebpf"
	"github.com/podnet/podnet/dataplane/proxy/nftables"
	"github.com/podnet/podnet/dataplane/status"
)

// statusReport is what the running proxyd's /status holds and, in ebpf
// mode, what its pinned maps hold.
type statusReport struct {
	Health       agent.HealthStatus `json:"health"`
	Node         agent.NodeStatus   `json:"node"`
	ServiceProxy proxy.Status       `json:"serviceProxy"`
	// NetworkPolicy is absent when proxyd runs without --network-policy.
	NetworkPolicy *policy.Status `json:"networkPolicy,omitempty"`
	// BPFMaps is read by proxyd status itself, from the pins.
	BPFMaps *bpfMaps `json:"bpfMaps,omitempty"`
	// NFTTable is read by proxyd status itself, from the kernel of the
	// network namespace it runs in (the node's).
	NFTTable *nftTable `json:"nftTable,omitempty"`
}

// runStatus is `proxyd status`: it asks the proxyd running on this node
// (its metrics port) what it has programmed and prints it; in ebpf mode
// beside what the maps pinned in --bpf-pin-dir hold.
func runStatus(args []string, stdout, stderr io.Writer) int {
	pinDir, pod := ebpf.DefaultPinDir, ""
	c, code, ok := status.ParseCommand("proxyd status", "metrics-bind-address", "127.0.0.1:10249", args, stdout, stderr, func(fs *pflag.FlagSet) {
		fs.StringVar(&pinDir, "bpf-pin-dir", pinDir, "ebpf mode: where the running proxyd pins its maps")
		fs.StringVar(&pod, "pod", "", "NAMESPACE/NAME: show only this pod's NetworkPolicies (which select it, what they allow)")
	})
	if !ok {
		return code
	}
	var r statusReport
	if !c.Fetch(&r) {
		return 1
	}
	if r.ServiceProxy.Mode == ebpf.Mode.Name {
		r.BPFMaps = readBPFMaps(pinDir, r.ServiceProxy.Services)
	}
	if r.ServiceProxy.Mode == nftables.Mode.Name {
		r.NFTTable = readNFTTable(r.ServiceProxy.Services)
	}
	if pod != "" {
		return printPodPolicies(stdout, stderr, r.NetworkPolicy, pod, c.JSON)
	}
	if c.JSON {
		status.PrintJSON(stdout, r)
		return 0
	}
	printStatus(stdout, r, time.Now())
	return 0
}

func printStatus(out io.Writer, r statusReport, now time.Time) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	ago := func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), now.Sub(t).Round(time.Second))
	}
	health := "ok"
	if !r.Health.Healthy {
		health = "UNHEALTHY: a change has waited " + r.Health.Pending
	} else if r.Health.Pending != "" {
		health = "ok, a change waiting for " + r.Health.Pending
	}
	fmt.Fprintf(w, "Mode:\t%s\n", r.ServiceProxy.Mode)
	fmt.Fprintf(w, "Health:\t%s\n", health)
	names := make([]string, 0, len(r.Health.Components))
	for n := range r.Health.Components {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %s:\t%s\n", n, r.Health.Components[n])
	}
	fmt.Fprintf(w, "Node:\t%s\n", r.Node.Name)
	podCIDRs, clusterCIDRs := r.Node.PodCIDR, r.Node.ClusterCIDR
	if len(r.Node.PodCIDRs) > 1 {
		podCIDRs = strings.Join(r.Node.PodCIDRs, ", ")
	}
	if len(r.Node.ClusterCIDRs) > 1 {
		clusterCIDRs = strings.Join(r.Node.ClusterCIDRs, ", ")
	}
	fmt.Fprintf(w, "  podCIDR:\t%s\n", orNone(podCIDRs))
	fmt.Fprintf(w, "  cluster CIDR:\t%s\n", clusterCIDRs)
	fmt.Fprintf(w, "  backend:\t%s\n", r.Node.Backend)
	fmt.Fprintf(w, "  cluster state:\t%s\n", r.Node.ClusterState)
	if r.Node.StateDir != nil {
		fmt.Fprintf(w, "  state directory:\t%s\n", r.Node.StateDir.Describe(now))
	}
	fmt.Fprintf(w, "  last route sync:\t%s\n", ago(r.Node.LastSync))
	if r.Node.LastError != "" {
		fmt.Fprintf(w, "  last route error:\t%s\n", r.Node.LastError)
	}
	sp := r.ServiceProxy
	fmt.Fprintf(w, "Service proxy:\t\n")
	kind := "partial"
	if sp.LastSyncFull {
		kind = "full"
	}
	if sp.LastSync.IsZero() {
		fmt.Fprintf(w, "  last sync:\tnever\n")
	} else {
		fmt.Fprintf(w, "  last sync:\t%s, %s, took %s\n", ago(sp.LastSync), kind, sp.LastSyncDuration)
	}
	if sp.LastError != "" {
		fmt.Fprintf(w, "  last error:\t%s\n", sp.LastError)
	}
	fmt.Fprintf(w, "  pending changes:\t%d Services, %d with endpoint changes\n", sp.PendingServiceChanges, sp.PendingEndpointChanges)
	w.Flush()

	printPeers(out, r)
	printServices(out, sp)
	if r.NetworkPolicy != nil {
		printPolicies(out, r.NetworkPolicy)
	}
	if r.BPFMaps != nil {
		printBPFMaps(out, r.BPFMaps)
	}
	if r.NFTTable != nil {
		printNFTTable(out, r.NFTTable)
	}
}

// printPeers prints the table of the node's peers and their routes.
func printPeers(out io.Writer, r statusReport) {
	fmt.Fprintf(out, "\nPeers (%d):\n", len(r.Node.Peers))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  NODE\tNODE IP\tPOD CIDR\tBACKEND\tROUTE")
	for _, p := range r.Node.Peers {
		fmt.Fprintf(w, "  %s\t%s\t%s\t%s\t%s\n", p.Name, p.NodeIP, p.PodCIDR, p.Backend, p.Route)
	}
	for _, s := range r.Node.Skipped {
		fmt.Fprintf(w, "  (not routed: %s)\n", s)
	}
	w.Flush()

}

// printServices prints the table of Services as programmed.
func printServices(out io.Writer, sp proxy.Status) {
	fmt.Fprintf(out, "\nServices (%d):\n", len(sp.Services))
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "  SERVICE\tPORT\tFRONTENDS\tENDPOINTS")
	for _, s := range sp.Services {
		for _, p := range s.Ports {
			port := p.Protocol
			if p.Name != "" {
				port = p.Name + "/" + p.Protocol
			}
			fmt.Fprintf(w, "  %s/%s\t%s\t%s\t%s\n", s.Namespace, s.Name, port, strings.Join(p.Frontends, " "), endpoints(p))
		}
	}
	w.Flush()
}

func endpoints(p proxy.PortStatus) string {
	if p.NoEndpoints {
		return "none (rejected)"
	}
	var out []string
	for _, e := range p.Endpoints {
		s := e.Address
		var tags []string
		if p.ExternalPolicyLocal || p.InternalPolicyLocal {
			if e.Local {
				tags = append(tags, "local")
			}
			if !e.Cluster {
				tags = append(tags, "local only")
			}
		}
		if e.Terminating {
			tags = append(tags, "terminating")
		}
		if len(tags) > 0 {
			s += " (" + strings.Join(tags, ", ") + ")"
		}
		out = append(out, s)
	}
	if len(out) == 0 {
		return "none on this node"
	}
	local := slices.ContainsFunc(p.Endpoints, func(e proxy.EndpointStatus) bool { return e.Local })
	if p.ExternalPolicyLocal && !local {
		out = append(out, "(external traffic: no local endpoint, dropped)")
	}
	return strings.Join(out, " ")
}

func orNone(s string) string {
	if s == "" {
		return "none yet"
	}
	return s
}

// printPolicies prints, for each pod of the node a NetworkPolicy selects,
// the policies per direction and what they allow.
func printPolicies(out io.Writer, st *policy.Status) {
	fmt.Fprintf(out, "\nNetworkPolicy (%d pods selected):\n", len(st.Pods))
	if st.Error != "" {
		fmt.Fprintf(out, "  last error: %s\n", st.Error)
	}
	for _, p := range st.Pods {
		printPodPolicy(out, p)
	}
}

func printPodPolicy(out io.Writer, p policy.PodStatus) {
	fmt.Fprintf(out, "  %s\n", p.Pod)
	for _, dir := range []struct {
		name string
		ps   []policy.PolicyStatus
	}{{"ingress", p.Ingress}, {"egress", p.Egress}} {
		if len(dir.ps) == 0 {
			fmt.Fprintf(out, "    %s: not isolated (everything allowed)\n", dir.name)
			continue
		}
		for _, ps := range dir.ps {
			if len(ps.Allows) == 0 {
				fmt.Fprintf(out, "    %s: %s allows nothing\n", dir.name, ps.Policy)
			}
			for _, a := range ps.Allows {
				fmt.Fprintf(out, "    %s: %s allows %s\n", dir.name, ps.Policy, a)
			}
		}
	}
}

// printPodPolicies is proxyd status --pod: the one pod's policies.
func printPodPolicies(stdout, stderr io.Writer, st *policy.Status, pod string, asJSON bool) int {
	if st == nil {
		fmt.Fprintln(stderr, "proxyd status: --pod: proxyd runs without --network-policy")
		return 1
	}
	p := policy.PodStatus{Pod: pod}
	if i := slices.IndexFunc(st.Pods, func(s policy.PodStatus) bool { return s.Pod == pod }); i >= 0 {
		p = st.Pods[i]
	}
	if asJSON {
		status.PrintJSON(stdout, p)
		return 0
	}
	printPodPolicy(stdout, p)
	return 0
}
