//go:build ignore

// nodeport.c: Services for traffic from outside the node (NodePort,
// externalIPs, load-balancer IPs), as tc (tcx) programs.
//
// nodeport_in runs on the ingress of the uplink and of the pod bridge. A
// packet to a frontend of scope external is DNATed to a backend and, for
// externalTrafficPolicy Cluster, SNATed to the node, then sent straight to
// the backend's interface (bpf_fib_lookup + bpf_redirect_neigh), past
// netfilter. The flow is remembered in two LRU maps: ct_fwd by the
// client's 5-tuple (later packets reuse the backend) and ct_rev by the
// reply's 5-tuple, by which replies (from other nodes on the uplink, from
// local pods on the bridge) are translated back. On the bridge the only
// frontends pods' packets still carry are load-balancer IPs with source
// ranges: socket LB translates everything else before a packet exists.
//
// The backend is picked by Maglev: a hash of the flow (of the client
// address with session affinity) indexes the service's lookup table, which
// every node computes alike from the same endpoints, so any node sends a
// given flow to the same backend, and an endpoint change moves few flows.
// A Service without endpoints answers ICMP port unreachable; one with
// endpoints, none of them for this traffic (policy Local, none here),
// drops it.

#include "lb.h"

struct ct_key {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport;
	__be16 dport;
	__u8 proto;
	__u8 pad[3];
};

// The translated flow: where it goes and the source it leaves with.
struct ct_fwd_val {
	__u8 baddr[16];
	__u8 naddr[16];
	__be16 bport;
	__be16 nport;
	__u32 pad;
};

// A reply's original addresses: the frontend (its new source) and the
// client (its new destination).
struct ct_rev_val {
	__u8 faddr[16];
	__u8 caddr[16];
	__be16 fport;
	__be16 cport;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct ct_key);
	__type(value, struct ct_fwd_val);
} ct_fwd_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct ct_key);
	__type(value, struct ct_rev_val);
} ct_rev_v1 SEC(".maps");

// loadBalancerSourceRanges by service id: prefix length counts the 32
// bits of the id, then the 128 of the address.
struct srcrange_key {
	__u32 prefixlen;
	__u32 svc;
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 1 << 14);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct srcrange_key);
	__type(value, __u8);
} srcrange_v1 SEC(".maps");

// Maglev lookup tables by service id: MAGLEV_M backend ids (M prime; the
// Go side fills them, dataplane/proxy/ebpf/maglev.go).
#define MAGLEV_M 1021

struct maglev_table {
	__u32 ids[MAGLEV_M];
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 14);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);
	__type(value, struct maglev_table);
} maglev_v1 SEC(".maps");

// The address traffic to externalIPs and load-balancer IPs is SNATed to
// (the node's address on the uplink); NodePorts use the address they were
// reached at.
struct snat_addr {
	__u8 addr[16];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct snat_addr);
} snat_v1 SEC(".maps");

#define IP_OFF ETH_HLEN
#define L4_OFF (ETH_HLEN + sizeof(struct iphdr))
#define IP_SRC_OFF (IP_OFF + 12)
#define IP_DST_OFF (IP_OFF + 16)
#define IP_CSUM_OFF (IP_OFF + 10)

struct flow {
	__be32 saddr, daddr;
	__be16 sport, dport;
	__u8 proto;
};

// parse reads an IPv4 TCP or UDP packet without options or fragments.
static __always_inline int parse(struct __sk_buff *skb, struct flow *f)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + IP_OFF;
	struct l4ports *l4 = data + L4_OFF;

	if ((void *)(l4 + 1) > end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl_version != 0x45)
		return 0;
	if (ip->frag_off & bpf_htons(0x3fff))
		return 0;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return 0;
	f->saddr = ip->saddr;
	f->daddr = ip->daddr;
	f->sport = l4->source;
	f->dport = l4->dest;
	f->proto = ip->protocol;
	return 1;
}

static __always_inline __u32 l4_csum_off(__u8 proto)
{
	return L4_OFF + (proto == IPPROTO_TCP ? 16 : 6);
}

// set_addr rewrites the source (src true) or destination address and
// port, fixing the IP and L4 checksums.
static __always_inline int set_addr(struct __sk_buff *skb, __u8 proto, int src, __be32 old_ip, __be32 new_ip,
				    __be16 old_port, __be16 new_port)
{
	__u64 mangled = proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u32 csum = l4_csum_off(proto);

	if (old_ip != new_ip) {
		if (bpf_l4_csum_replace(skb, csum, old_ip, new_ip, BPF_F_PSEUDO_HDR | mangled | 4) ||
		    bpf_l3_csum_replace(skb, IP_CSUM_OFF, old_ip, new_ip, 4) ||
		    bpf_skb_store_bytes(skb, src ? IP_SRC_OFF : IP_DST_OFF, &new_ip, 4, 0))
			return -1;
	}
	if (old_port != new_port) {
		if (bpf_l4_csum_replace(skb, csum, old_port, new_port, mangled | 2) ||
		    bpf_skb_store_bytes(skb, L4_OFF + (src ? 0 : 2), &new_port, 2, 0))
			return -1;
	}
	return 0;
}

// forward sends the rewritten packet out of the interface its new
// destination is routed through; without a route it goes up the stack.
static __always_inline int forward(struct __sk_buff *skb, __be32 saddr, __be32 daddr)
{
	struct bpf_fib_lookup p = {};

	p.family = AF_INET;
	p.ipv4_src = saddr;
	p.ipv4_dst = daddr;
	p.ifindex = skb->ingress_ifindex;
	long rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(p.ifindex, 0, 0, 0);
	return TC_ACT_OK;
}

static __always_inline void ct_key_of(struct ct_key *k, __be32 s, __be16 sp, __be32 d, __be16 dp, __u8 proto)
{
	addr_set4(k->saddr, s);
	addr_set4(k->daddr, d);
	k->sport = sp;
	k->dport = dp;
	k->proto = proto;
}

static __always_inline __be32 addr4(const __u8 *a) { return ((const __u32 *)a)[3]; }

// reverse translates a reply of a flow this program translated.
static __always_inline int reverse(struct __sk_buff *skb, struct flow *f)
{
	struct ct_key k = {};

	ct_key_of(&k, f->saddr, f->sport, f->daddr, f->dport, f->proto);
	struct ct_rev_val *r = bpf_map_lookup_elem(&ct_rev_v1, &k);
	if (!r)
		return TC_ACT_UNSPEC;
	__be32 fa = addr4(r->faddr), ca = addr4(r->caddr);
	if (set_addr(skb, f->proto, 1, f->saddr, fa, f->sport, r->fport) ||
	    set_addr(skb, f->proto, 0, f->daddr, ca, f->dport, r->cport))
		return TC_ACT_SHOT;
	return forward(skb, fa, ca);
}

static __always_inline __u32 mix(__u32 h, __u32 v)
{
	h ^= v;
	h *= 0x9e3779b1;
	return h ^ (h >> 15);
}

static __always_inline __u32 flow_hash(struct flow *f, struct svc_val *fe)
{
	__u32 h = mix(0x5bd1e995, f->saddr);
	if (!(fe->flags & FE_AFFINITY)) {
		h = mix(h, f->daddr);
		h = mix(h, ((__u32)f->sport << 16) | f->dport);
		h = mix(h, f->proto);
	}
	return h;
}

// pick chooses the flow's backend: from the service's Maglev table, or,
// while it has none, from the slots (which every node also holds in the
// same order).
static __always_inline struct backend *pick(struct flow *f, struct svc_key *key, struct svc_val *fe)
{
	__u32 h = flow_hash(f, fe);
	__u32 svc = fe->id;
	struct maglev_table *t = bpf_map_lookup_elem(&maglev_v1, &svc);
	if (t) {
		__u32 idx = h % MAGLEV_M;
		// Keep the compiler from dropping the bound the verifier needs.
		asm volatile("" : "+r"(idx));
		if (idx >= MAGLEV_M)
			return 0;
		__u32 id = t->ids[idx];
		return bpf_map_lookup_elem(&backends_v1, &id);
	}
	return lb_slot(key, h % fe->count + 1);
}

// snat_port finds a source port on the node for a new SNATed flow: the
// client's own when no other flow to that backend uses it.
static __always_inline __be16 snat_port(struct flow *f, __be32 naddr, __be32 baddr, __be16 bport)
{
	struct ct_key k = {};
	__u16 port = bpf_ntohs(f->sport);

	for (int i = 0; i < 8; i++) {
		ct_key_of(&k, baddr, bport, naddr, bpf_htons(port), f->proto);
		if (!bpf_map_lookup_elem(&ct_rev_v1, &k))
			return bpf_htons(port);
		port = 32768 + (mix(port, f->saddr + i) % 28232);
	}
	return 0;
}

static __always_inline int srcrange_ok(struct svc_val *fe, __be32 saddr)
{
	struct srcrange_key k = {.prefixlen = 32 + 128, .svc = fe->id};

	addr_set4(k.addr, saddr);
	return bpf_map_lookup_elem(&srcrange_v1, &k) != 0;
}

// new_flow picks a backend for a flow's first packet and records it.
static __always_inline struct ct_fwd_val *new_flow(struct flow *f, struct ct_key *fk, struct svc_key *key,
						   struct svc_val *fe, int nodeport)
{
	struct ct_fwd_val fv = {};
	struct ct_rev_val rv = {};
	struct backend *be = pick(f, key, fe);
	if (!be)
		return 0;
	__be32 baddr = addr4(be->addr), naddr = f->saddr;
	__be16 nport = f->sport;
	if (!(fe->flags & FE_LOCAL)) {
		naddr = f->daddr;
		if (!nodeport) {
			__u32 zero = 0;
			struct snat_addr *sa = bpf_map_lookup_elem(&snat_v1, &zero);
			if (!sa || !addr4(sa->addr))
				return 0;
			naddr = addr4(sa->addr);
		}
		nport = snat_port(f, naddr, baddr, be->port);
		if (!nport)
			return 0;
	}
	__builtin_memcpy(fv.baddr, be->addr, 16);
	fv.bport = be->port;
	addr_set4(fv.naddr, naddr);
	fv.nport = nport;
	addr_set4(rv.faddr, f->daddr);
	rv.fport = f->dport;
	addr_set4(rv.caddr, f->saddr);
	rv.cport = f->sport;
	struct ct_key rk = {};
	ct_key_of(&rk, baddr, be->port, naddr, nport, f->proto);
	if (bpf_map_update_elem(&ct_rev_v1, &rk, &rv, BPF_ANY) ||
	    bpf_map_update_elem(&ct_fwd_v1, fk, &fv, BPF_ANY))
		return 0;
	return bpf_map_lookup_elem(&ct_fwd_v1, fk);
}

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u32 s = (__u32)sum;
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~s;
}

// The reply to a packet for a Service without endpoints: ICMP port
// unreachable from the address it was sent to, quoting its IP header and
// first 8 bytes, sent back out of the interface it came in on.
struct icmp_unreach {
	__u16 align; // puts ip on a 4-byte boundary for bpf_csum_diff
	struct ethhdr eth;
	struct iphdr ip;
	__u8 type;
	__u8 code;
	__u16 check;
	__u32 unused;
	__u8 quote[sizeof(struct iphdr) + 8];
};

#define ICMP_UNREACH_LEN (sizeof(struct icmp_unreach) - 2)

static __always_inline int port_unreachable(struct __sk_buff *skb)
{
	struct icmp_unreach r = {};
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) ||
	    bpf_skb_load_bytes(skb, IP_OFF, r.quote, sizeof(r.quote)))
		return TC_ACT_SHOT;
	struct iphdr *orig = (struct iphdr *)r.quote;
	__builtin_memcpy(r.eth.h_dest, eth.h_source, 6);
	__builtin_memcpy(r.eth.h_source, eth.h_dest, 6);
	r.eth.h_proto = bpf_htons(ETH_P_IP);
	r.ip.ihl_version = 0x45;
	r.ip.tot_len = bpf_htons(ICMP_UNREACH_LEN - sizeof(r.eth));
	r.ip.ttl = 64;
	r.ip.protocol = IPPROTO_ICMP;
	r.ip.saddr = orig->daddr;
	r.ip.daddr = orig->saddr;
	r.ip.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&r.ip, sizeof(r.ip), 0));
	r.type = 3; // destination unreachable
	r.code = 3; // port unreachable
	r.check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)&r.type, 8 + sizeof(r.quote), 0));
	if (bpf_skb_change_tail(skb, ICMP_UNREACH_LEN, 0) || bpf_skb_store_bytes(skb, 0, &r.eth, ICMP_UNREACH_LEN, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ingress_ifindex, 0);
}

SEC("tc")
int nodeport_in(struct __sk_buff *skb)
{
	struct flow f = {};
	struct ct_key fk = {};

	if (!parse(skb, &f))
		return TC_ACT_UNSPEC;
	int ret = reverse(skb, &f);
	if (ret != TC_ACT_UNSPEC)
		return ret;

	struct svc_key key = {.port = f.dport, .proto = f.proto, .scope = SCOPE_EXT};
	addr_set4(key.addr, f.daddr);
	struct svc_val *fe = lb_frontend(&key);
	if (!fe)
		return TC_ACT_UNSPEC;
	// The NodePort wildcard (::ffff:0.0.0.0) answered: reached at a node
	// address, which the flow is SNATed to.
	int nodeport = addr4(key.addr) != f.daddr;
	if ((fe->flags & FE_SRCRANGE) && !srcrange_ok(fe, f.saddr))
		return TC_ACT_SHOT;

	ct_key_of(&fk, f.saddr, f.sport, f.daddr, f.dport, f.proto);
	struct ct_fwd_val *fv = bpf_map_lookup_elem(&ct_fwd_v1, &fk);
	if (!fv) {
		if (fe->count == 0)
			return fe->flags & FE_REJECT ? port_unreachable(skb) : TC_ACT_SHOT;
		fv = new_flow(&f, &fk, &key, fe, nodeport);
		if (!fv)
			return TC_ACT_SHOT;
	}
	__be32 baddr = addr4(fv->baddr), naddr = addr4(fv->naddr);
	__be16 bport = fv->bport, nport = fv->nport;
	if (set_addr(skb, f.proto, 0, f.daddr, baddr, f.dport, bport) ||
	    set_addr(skb, f.proto, 1, f.saddr, naddr, f.sport, nport))
		return TC_ACT_SHOT;
	return forward(skb, naddr, baddr);
}

char _license[] SEC("license") = "Dual BSD/GPL";
