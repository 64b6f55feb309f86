// Package podcidr gives a node its podCIDR when kube-controller-manager does
// not allocate them (--allocate-node-cidrs off): the node claims a free
// subnet of the cluster CIDR itself and writes it into its Node.
//
// Claims are made race-free by the API server, not by reading and hoping:
// a claim is a coordination.k8s.io Lease named after the subnet, and
// creating an object whose name exists fails. Two nodes racing for the same
// subnet both try to create its Lease; exactly one succeeds, the other moves
// on to the next subnet. A claim's Lease is owned by its Node, so the
// garbage collector frees the subnet when the Node is deleted.
//
// The Leases live in podnet's own namespace, so the node agent's right to
// create and delete Leases is a Role there, not one over every namespace
// (kube-node-lease holds the kubelets' heartbeats, which a compromised agent
// could otherwise delete or forge).
package podcidr

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/podnet/podnet/dataplane/ipfamily"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// LabelClaim marks the Leases that are podCIDR claims; its value is the
// subnet's Lease-name form.
const LabelClaim = "podnet.io/pod-cidr"

// DefaultNamespace holds the claims: the namespace of deploy/'s DaemonSet.
const DefaultNamespace = "podnet-system"

// ErrExhausted is returned when every subnet of the cluster CIDR is taken.
var ErrExhausted = errors.New("no free podCIDR left in the cluster CIDR")

// Options say which node claims what.
type Options struct {
	Client   kubernetes.Interface
	NodeName string
	// ClusterCIDR is divided into subnets of MaskSize bits.
	ClusterCIDR netip.Prefix
	// MaskSize of each node's podCIDR; 24 when 0.
	MaskSize int
	// Namespace of the claim Leases; DefaultNamespace when empty.
	Namespace string
}

// Validate checks the options and fills in the defaults.
func (o *Options) Validate() error {
	if o.Client == nil {
		return errors.New("podcidr: Client is required")
	}
	if o.NodeName == "" {
		return errors.New("podcidr: NodeName is required")
	}
	f := ipfamily.OfPrefix(o.ClusterCIDR)
	if !o.ClusterCIDR.IsValid() || !f.Valid() {
		return fmt.Errorf("podcidr: cluster CIDR %v: want an IPv4 or IPv6 prefix", o.ClusterCIDR)
	}
	o.ClusterCIDR = o.ClusterCIDR.Masked()
	// kube-controller-manager's defaults: /24 for IPv4, /64 for IPv6.
	maxSize := f.Bits() - 2
	if o.MaskSize == 0 {
		o.MaskSize = 24
		if f == ipfamily.IPv6 {
			o.MaskSize = 64
		}
	}
	if o.MaskSize < o.ClusterCIDR.Bits() || o.MaskSize > maxSize || o.MaskSize-o.ClusterCIDR.Bits() > 16 {
		return fmt.Errorf("podcidr: mask size %d: want %d..%d and at most 2^16 subnets of %v", o.MaskSize, o.ClusterCIDR.Bits(), maxSize, o.ClusterCIDR)
	}
	if o.Namespace == "" {
		o.Namespace = DefaultNamespace
	}
	return nil
}

// Ensure returns the node's podCIDR of o's family: the one in its Node if
// there is one, else a subnet it claims now and writes into
// Node.spec.podCIDR(s). It is safe to call again after a crash at any
// point: a claim the node already holds is found and reused.
func Ensure(ctx context.Context, o Options) (netip.Prefix, error) {
	ps, err := EnsureAll(ctx, []Options{o})
	if err != nil {
		return netip.Prefix{}, err
	}
	f := ipfamily.OfPrefix(o.ClusterCIDR)
	for _, p := range ps {
		if f.HasPrefix(p) {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("node %s: podCIDRs %v hold none of %v", o.NodeName, ps, f)
}

// EnsureAll returns the node's podCIDRs, one per Options (one per family:
// a dual-stack node's pair), claiming each family's subnet with its own
// Lease and writing them into the Node in one patch: the API server lets
// spec.podCIDRs be set once, so both families go together. A Node that
// already has podCIDRs keeps them. Every Options names the same node.
func EnsureAll(ctx context.Context, opts []Options) ([]netip.Prefix, error) {
	if len(opts) == 0 {
		return nil, errors.New("podcidr: no cluster CIDR")
	}
	seen := map[ipfamily.Family]bool{}
	for i := range opts {
		if err := opts[i].Validate(); err != nil {
			return nil, err
		}
		f := ipfamily.OfPrefix(opts[i].ClusterCIDR)
		if seen[f] {
			return nil, fmt.Errorf("podcidr: two %v cluster CIDRs; want one per family", f)
		}
		seen[f] = true
	}
	o0 := opts[0]
	nodes := o0.Client.CoreV1().Nodes()
	node, err := nodes.Get(ctx, o0.NodeName, metav1.GetOptions{})
	if err != nil {
		return nil, fmt.Errorf("get node %s: %w", o0.NodeName, err)
	}
	if have, err := podCIDRs(node); err != nil || len(have) > 0 {
		return have, err
	}
	var mine []netip.Prefix
	for i := range opts {
		p, err := opts[i].claim(ctx, node)
		if err != nil {
			return nil, err
		}
		mine = append(mine, p)
	}
	if err := o0.writeNode(ctx, mine); err != nil {
		// Set by someone else (kube-controller-manager, say) meanwhile?
		if n, gerr := nodes.Get(ctx, o0.NodeName, metav1.GetOptions{}); gerr == nil {
			if have, perr := podCIDRs(n); perr == nil && len(have) > 0 {
				for i, p := range mine {
					opts[i].release(ctx, p)
				}
				return have, nil
			}
		}
		return nil, err
	}
	return mine, nil
}

// podCIDRs reads a Node's podCIDRs (spec.podCIDRs, else spec.podCIDR).
func podCIDRs(node *corev1.Node) ([]netip.Prefix, error) {
	list := node.Spec.PodCIDRs
	if len(list) == 0 && node.Spec.PodCIDR != "" {
		list = []string{node.Spec.PodCIDR}
	}
	var out []netip.Prefix
	for _, s := range list {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("node %s: podCIDR %q: %w", node.Name, s, err)
		}
		out = append(out, p)
	}
	return out, nil
}

// claim returns the subnet of o's cluster CIDR this node claims: the one
// it already holds, else the first free one, claimed now.
func (o *Options) claim(ctx context.Context, node *corev1.Node) (netip.Prefix, error) {
	taken, mine, err := o.claims(ctx)
	if err != nil || mine.IsValid() {
		return mine, err
	}
	return o.claimFree(ctx, node, taken)
}

// release gives a claim back; one left behind only wastes a subnet until
// its Node is deleted, so failure is not reported.
func (o *Options) release(ctx context.Context, p netip.Prefix) {
	_ = o.Client.CoordinationV1().Leases(o.Namespace).Delete(ctx, LeaseName(p), metav1.DeleteOptions{})
}

// claims returns the subnets in use (by Nodes or by claims) and the one
// this node already claimed, if any.
func (o *Options) claims(ctx context.Context) (map[netip.Prefix]bool, netip.Prefix, error) {
	taken := map[netip.Prefix]bool{}
	var mine netip.Prefix
	nodeList, err := o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, mine, fmt.Errorf("list nodes: %w", err)
	}
	for _, n := range nodeList.Items {
		for _, s := range append([]string{n.Spec.PodCIDR}, n.Spec.PodCIDRs...) {
			if p, err := netip.ParsePrefix(s); err == nil {
				taken[p.Masked()] = true
			}
		}
	}
	leases, err := o.Client.CoordinationV1().Leases(o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: LabelClaim})
	if err != nil {
		return nil, mine, fmt.Errorf("list podCIDR claims: %w", err)
	}
	for _, l := range leases.Items {
		p, ok := ParseLeaseName(l.Name)
		if !ok {
			continue
		}
		taken[p] = true
		if holder(&l) == o.NodeName && o.ClusterCIDR.Contains(p.Addr()) {
			mine = p
		}
	}
	return taken, mine, nil
}

// claimFree creates the Lease of the first subnet nobody holds. A subnet
// claimed between the list and the create is skipped when the create
// fails.
func (o *Options) claimFree(ctx context.Context, node *corev1.Node, taken map[netip.Prefix]bool) (netip.Prefix, error) {
	leases := o.Client.CoordinationV1().Leases(o.Namespace)
	count := 1 << (o.MaskSize - o.ClusterCIDR.Bits())
	for i := range count {
		p := nthSubnet(o.ClusterCIDR, o.MaskSize, i)
		if taken[p] {
			continue
		}
		_, err := leases.Create(ctx, o.lease(node, p), metav1.CreateOptions{})
		if err == nil {
			return p, nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return netip.Prefix{}, fmt.Errorf("claim %v: %w", p, err)
		}
		l, gerr := leases.Get(ctx, LeaseName(p), metav1.GetOptions{})
		if gerr == nil && holder(l) == o.NodeName {
			return p, nil
		}
	}
	return netip.Prefix{}, fmt.Errorf("%w %v (/%d per node)", ErrExhausted, o.ClusterCIDR, o.MaskSize)
}

func (o *Options) lease(node *corev1.Node, p netip.Prefix) *coordinationv1.Lease {
	name := LeaseName(p)
	holderID := o.NodeName
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{
			Name:      name,
			Namespace: o.Namespace,
			Labels:    map[string]string{LabelClaim: name},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1",
				Kind:       "Node",
				Name:       node.Name,
				UID:        node.UID,
			}},
		},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holderID},
	}
}

// writeNode sets the node's podCIDRs (podCIDR is the first, as the API
// server requires). The API server lets them be set only once, so if
// something else set them first this fails and EnsureAll takes those.
func (o *Options) writeNode(ctx context.Context, ps []netip.Prefix) error {
	list := make([]string, len(ps))
	for i, p := range ps {
		list[i] = p.String()
	}
	patch, err := json.Marshal(map[string]any{"spec": map[string]any{
		"podCIDR":  list[0],
		"podCIDRs": list,
	}})
	if err != nil {
		return err
	}
	_, err = o.Client.CoreV1().Nodes().Patch(ctx, o.NodeName, types.StrategicMergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("set podCIDRs %v on node %s: %w", ps, o.NodeName, err)
	}
	return nil
}

func holder(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

// LeaseName is the name of the Lease claiming p: "podcidr-10.244.3.0-24";
// an IPv6 address, whose colons no object name may hold, is written as its
// 32 hex digits ("podcidr-fd000244000000030000000000000000-64").
func LeaseName(p netip.Prefix) string {
	if ipfamily.OfPrefix(p) == ipfamily.IPv6 {
		return fmt.Sprintf("podcidr-%x-%d", p.Addr().AsSlice(), p.Bits())
	}
	return fmt.Sprintf("podcidr-%s-%d", p.Addr(), p.Bits())
}

// ParseLeaseName is the inverse of LeaseName.
func ParseLeaseName(name string) (netip.Prefix, bool) {
	rest, ok := strings.CutPrefix(name, "podcidr-")
	if !ok {
		return netip.Prefix{}, false
	}
	i := strings.LastIndexByte(rest, '-')
	if i < 0 {
		return netip.Prefix{}, false
	}
	addr := rest[:i]
	if b, err := hex.DecodeString(addr); err == nil && len(b) == 16 {
		addr = netip.AddrFrom16([16]byte(b)).String()
	}
	p, err := netip.ParsePrefix(addr + "/" + rest[i+1:])
	if err != nil || p != p.Masked() {
		return netip.Prefix{}, false
	}
	return p, true
}

// nthSubnet is the i-th subnet of size bits in cidr (Validate keeps i in
// range).
func nthSubnet(cidr netip.Prefix, bits, i int) netip.Prefix {
	p, _ := ipfamily.Subnet(cidr, bits, uint64(i))
	return p
}
