package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/podnet/podnet/dataplane/cluster"
)

// Status is the policy section of proxyd's /status: for each pod of this
// node that a policy selects, which policies select it and what they allow.
type Status struct {
	Syncs    uint64      `json:"syncs"`
	LastSync time.Time   `json:"lastSync,omitzero"`
	Error    string      `json:"error,omitempty"`
	Pods     []PodStatus `json:"pods,omitempty"`
}

// PodStatus is one selected pod. A direction with policies is isolated: only
// what they allow passes.
type PodStatus struct {
	Pod     string         `json:"pod"`
	Ingress []PolicyStatus `json:"ingress,omitempty"`
	Egress  []PolicyStatus `json:"egress,omitempty"`
}

// PolicyStatus is one policy selecting the pod, and its rules in words.
type PolicyStatus struct {
	Policy string   `json:"policy"`
	Allows []string `json:"allows"`
}

// Status reports the last synced model.
func (c *Controller) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.resMu.Lock()
	st := Status{Syncs: c.syncs, LastSync: c.lastSync}
	if c.lastErr != nil {
		st.Error = c.lastErr.Error()
	}
	c.resMu.Unlock()
	if c.model != nil {
		st.Pods = c.model.PodStatuses(func(p *cluster.Pod) bool { return p.NodeName == c.o.NodeName })
	}
	return st
}

// PodStatuses describes the policies selecting each pod that local picks,
// by pod key.
func (m *Model) PodStatuses(local func(*cluster.Pod) bool) []PodStatus {
	seen := make(map[*cluster.Pod]bool)
	var out []PodStatus
	for _, p := range m.pods {
		if seen[p] || !local(p) {
			continue
		}
		seen[p] = true
		ps := PodStatus{Pod: p.Key().String(), Ingress: describe(m.Selecting(p, Ingress), Ingress), Egress: describe(m.Selecting(p, Egress), Egress)}
		if len(ps.Ingress)+len(ps.Egress) > 0 {
			out = append(out, ps)
		}
	}
	slices.SortFunc(out, func(a, b PodStatus) int { return strings.Compare(a.Pod, b.Pod) })
	return out
}

func describe(nps []*cluster.NetworkPolicy, d Direction) []PolicyStatus {
	var out []PolicyStatus
	for _, np := range nps {
		ps := PolicyStatus{Policy: np.Key().String(), Allows: []string{}}
		for _, r := range rules(np, d) {
			ps.Allows = append(ps.Allows, DescribeRule(np, r, d))
		}
		out = append(out, ps)
	}
	return out
}

// DescribeRule says what one rule lets through, as "from pods app=client in
// namespaces team=b on TCP/80, UDP/dns".
func DescribeRule(np *cluster.NetworkPolicy, r cluster.PolicyRule, d Direction) string {
	word := "from"
	if d == Egress {
		word = "to"
	}
	peers := "anyone"
	if len(r.Peers) > 0 {
		var ps []string
		for _, p := range r.Peers {
			ps = append(ps, describePeer(np, p))
		}
		peers = strings.Join(ps, "; ")
	}
	ports := "any port"
	if len(r.Ports) > 0 {
		var ps []string
		for _, p := range r.Ports {
			ps = append(ps, describePort(p))
		}
		ports = strings.Join(ps, ", ")
	}
	return fmt.Sprintf("%s %s on %s", word, peers, ports)
}

func describePeer(np *cluster.NetworkPolicy, p cluster.PolicyPeer) string {
	if p.IsBlock() {
		s := p.Block.String()
		if len(p.Except) > 0 {
			s += fmt.Sprintf(" except %v", p.Except)
		}
		return s
	}
	pods := "all pods"
	if !p.Pods.Empty() {
		pods = "pods " + p.Pods.String()
	}
	switch {
	case p.Namespaces == nil:
		return fmt.Sprintf("%s of namespace %s", pods, np.Namespace)
	case p.Namespaces.Empty():
		return pods + " of every namespace"
	}
	return fmt.Sprintf("%s of namespaces %s", pods, p.Namespaces)
}

func describePort(p cluster.PolicyPort) string {
	switch {
	case p.Named != "":
		return fmt.Sprintf("%s/%s", p.Protocol, p.Named)
	case p.Port == 0:
		return fmt.Sprintf("%s/any", p.Protocol)
	case p.EndPort != p.Port:
		return fmt.Sprintf("%s/%d-%d", p.Protocol, p.Port, p.EndPort)
	}
	return fmt.Sprintf("%s/%d", p.Protocol, p.Port)
}
