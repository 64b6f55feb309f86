package cluster

import (
	"net/netip"

	"k8s.io/apimachinery/pkg/labels"
)

// NetworkPolicy is a networking.k8s.io/v1 NetworkPolicy, its selectors parsed
// and its peers and ports checked by cluster/convert as the API server checks
// them, so consumers only match.
type NetworkPolicy struct {
	Namespace string
	Name      string
	// PodSelector picks the pods of Namespace the policy applies to;
	// labels.Everything() for the empty selector.
	PodSelector labels.Selector
	// Ingress and Egress are spec.policyTypes, with the API's default:
	// Ingress always, Egress when egress rules are given.
	Ingress, Egress bool
	IngressRules    []PolicyRule
	EgressRules     []PolicyRule
}

func (p *NetworkPolicy) Kind() Kind { return KindNetworkPolicy }
func (p *NetworkPolicy) Key() Key   { return Key{Namespace: p.Namespace, Name: p.Name} }

// PolicyRule is one ingress or egress rule: traffic with any of Peers on any
// of Ports. No peers means every peer, no ports every port.
type PolicyRule struct {
	Peers []PolicyPeer
	Ports []PolicyPort
}

// PolicyPeer is one from/to entry: either pods (by selectors) or an ipBlock.
type PolicyPeer struct {
	// Pods selects pods by label; nil when the peer is an ipBlock or only
	// a namespaceSelector (which means every pod of those namespaces).
	Pods labels.Selector
	// Namespaces selects namespaces by label; nil means the policy's own.
	Namespaces labels.Selector
	// Block is the ipBlock's cidr, invalid when the peer is no ipBlock;
	// Except are carved out of it.
	Block  netip.Prefix
	Except []netip.Prefix
}

// IsBlock says whether the peer is an ipBlock.
func (p PolicyPeer) IsBlock() bool { return p.Block.IsValid() }

// PolicyPort is one ports entry. Named is a container port name resolved
// at the destination pod; otherwise Port..EndPort (EndPort = Port for a
// single port), and Port 0 means every port of Protocol.
type PolicyPort struct {
	Protocol Protocol
	Named    string
	Port     uint16
	EndPort  uint16
}
