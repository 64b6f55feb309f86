package convert

import (
	"errors"
	"fmt"
	"net/netip"

	v1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/podnet/podnet/dataplane/cluster"
)

// FromV1NetworkPolicy checks a NetworkPolicy as the API server does
// (selectors, policyTypes, peers, CIDRs, ports and endPort) and reduces it.
// The error names the policy and the field at fault.
func FromV1NetworkPolicy(np *networkingv1.NetworkPolicy) (*cluster.NetworkPolicy, error) {
	out := &cluster.NetworkPolicy{Namespace: defaultNamespace(np.Namespace), Name: np.Name}
	if err := fromV1NetworkPolicySpec(out, &np.Spec); err != nil {
		return nil, fmt.Errorf("networkpolicy %s: %w", out.Key(), err)
	}
	return out, nil
}

func fromV1NetworkPolicySpec(out *cluster.NetworkPolicy, spec *networkingv1.NetworkPolicySpec) error {
	var err error
	if out.PodSelector, err = selector("spec.podSelector", &spec.PodSelector); err != nil {
		return err
	}
	if err := policyTypes(out, spec); err != nil {
		return err
	}
	for i, r := range spec.Ingress {
		rule, err := policyRule(fmt.Sprintf("spec.ingress[%d]", i), "from", r.From, r.Ports)
		if err != nil {
			return err
		}
		out.IngressRules = append(out.IngressRules, rule)
	}
	for i, r := range spec.Egress {
		rule, err := policyRule(fmt.Sprintf("spec.egress[%d]", i), "to", r.To, r.Ports)
		if err != nil {
			return err
		}
		out.EgressRules = append(out.EgressRules, rule)
	}
	return nil
}

// policyTypes applies the API's default: Ingress, plus Egress when the spec
// has egress rules.
func policyTypes(out *cluster.NetworkPolicy, spec *networkingv1.NetworkPolicySpec) error {
	if len(spec.PolicyTypes) == 0 {
		out.Ingress, out.Egress = true, len(spec.Egress) > 0
		return nil
	}
	if len(spec.PolicyTypes) > 2 {
		return errors.New("spec.policyTypes: at most Ingress and Egress")
	}
	for i, t := range spec.PolicyTypes {
		field := fmt.Sprintf("spec.policyTypes[%d]", i)
		switch {
		case t == networkingv1.PolicyTypeIngress && !out.Ingress:
			out.Ingress = true
		case t == networkingv1.PolicyTypeEgress && !out.Egress:
			out.Egress = true
		case t == networkingv1.PolicyTypeIngress || t == networkingv1.PolicyTypeEgress:
			return fmt.Errorf("%s: duplicate value %q", field, t)
		default:
			return fmt.Errorf("%s: unsupported value %q: Ingress or Egress", field, t)
		}
	}
	return nil
}

func selector(field string, s *metav1.LabelSelector) (labels.Selector, error) {
	sel, err := metav1.LabelSelectorAsSelector(s)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", field, err)
	}
	return sel, nil
}

func policyRule(field, peersField string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (cluster.PolicyRule, error) {
	var rule cluster.PolicyRule
	for i, p := range peers {
		peer, err := policyPeer(fmt.Sprintf("%s.%s[%d]", field, peersField, i), p)
		if err != nil {
			return rule, err
		}
		rule.Peers = append(rule.Peers, peer)
	}
	for i, p := range ports {
		port, err := policyPort(fmt.Sprintf("%s.ports[%d]", field, i), p)
		if err != nil {
			return rule, err
		}
		rule.Ports = append(rule.Ports, port)
	}
	return rule, nil
}

func policyPeer(field string, p networkingv1.NetworkPolicyPeer) (cluster.PolicyPeer, error) {
	var out cluster.PolicyPeer
	if p.IPBlock != nil {
		if p.PodSelector != nil || p.NamespaceSelector != nil {
			return out, fmt.Errorf("%s: ipBlock may not be combined with podSelector or namespaceSelector", field)
		}
		return ipBlock(field+".ipBlock", p.IPBlock)
	}
	if p.PodSelector == nil && p.NamespaceSelector == nil {
		return out, fmt.Errorf("%s: must specify a podSelector, a namespaceSelector or an ipBlock", field)
	}
	var err error
	if p.PodSelector != nil {
		if out.Pods, err = selector(field+".podSelector", p.PodSelector); err != nil {
			return out, err
		}
	}
	if p.NamespaceSelector != nil {
		if out.Namespaces, err = selector(field+".namespaceSelector", p.NamespaceSelector); err != nil {
			return out, err
		}
	}
	if out.Pods == nil {
		out.Pods = labels.Everything()
	}
	return out, nil
}

func ipBlock(field string, b *networkingv1.IPBlock) (cluster.PolicyPeer, error) {
	var out cluster.PolicyPeer
	cidr, err := netip.ParsePrefix(b.CIDR)
	if err != nil {
		return out, fmt.Errorf("%s.cidr: %q is not a CIDR", field, b.CIDR)
	}
	out.Block = cidr.Masked()
	for i, e := range b.Except {
		f := fmt.Sprintf("%s.except[%d]", field, i)
		ex, err := netip.ParsePrefix(e)
		if err != nil {
			return out, fmt.Errorf("%s: %q is not a CIDR", f, e)
		}
		ex = ex.Masked()
		if ex.Addr().Is4() != out.Block.Addr().Is4() || ex.Bits() <= out.Block.Bits() || !out.Block.Contains(ex.Addr()) {
			return out, fmt.Errorf("%s: %s must be a strict subset of cidr %s", f, ex, out.Block)
		}
		out.Except = append(out.Except, ex)
	}
	return out, nil
}

func policyPort(field string, p networkingv1.NetworkPolicyPort) (cluster.PolicyPort, error) {
	out := cluster.PolicyPort{Protocol: cluster.TCP}
	if p.Protocol != nil {
		switch *p.Protocol {
		case v1.ProtocolTCP, v1.ProtocolUDP, v1.ProtocolSCTP:
			out.Protocol = protocol(*p.Protocol)
		default:
			return out, fmt.Errorf("%s.protocol: unsupported value %q: TCP, UDP or SCTP", field, *p.Protocol)
		}
	}
	if p.Port == nil {
		if p.EndPort != nil {
			return out, fmt.Errorf("%s.endPort: may not be set without port", field)
		}
		return out, nil
	}
	if p.Port.Type == intstr.String {
		if msgs := validation.IsValidPortName(p.Port.StrVal); len(msgs) > 0 {
			return out, fmt.Errorf("%s.port: %q: %s", field, p.Port.StrVal, msgs[0])
		}
		if p.EndPort != nil {
			return out, fmt.Errorf("%s.endPort: may not be set with the named port %q", field, p.Port.StrVal)
		}
		out.Named = p.Port.StrVal
		return out, nil
	}
	if err := validPort(field+".port", p.Port.IntVal); err != nil {
		return out, err
	}
	out.Port, out.EndPort = uint16(p.Port.IntVal), uint16(p.Port.IntVal)
	if p.EndPort != nil {
		if err := validPort(field+".endPort", *p.EndPort); err != nil {
			return out, err
		}
		if *p.EndPort < p.Port.IntVal {
			return out, fmt.Errorf("%s.endPort: %d is below port %d", field, *p.EndPort, p.Port.IntVal)
		}
		out.EndPort = uint16(*p.EndPort)
	}
	return out, nil
}
