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
//
// Both families take the same path: a flow's addresses are 16 bytes, IPv4
// as ::ffff:a.b.c.d, so only parsing, rewriting (IPv6 has no header
// checksum; its L4 checksum covers the 16-byte addresses), the route
// lookup and the ICMP(v6) answer look at the family. An IPv6 NodePort
// answers at the node's IPv6 addresses (the wildcard ::), and
// externalIPs and load-balancer IPs SNAT to the family's own address.

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
} srcrange_v2 SEC(".maps");

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
} maglev_v2 SEC(".maps");

// The addresses traffic to externalIPs and load-balancer IPs is SNATed to
// (the node's address on the uplink), by family: SNAT_V4 and SNAT_V6.
// NodePorts use the address they were reached at.
struct snat_addr {
	__u8 addr[16];
};

#define SNAT_V4 0
#define SNAT_V6 1

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct snat_addr);
} snat_v2 SEC(".maps");

// Offsets in an IPv4 packet (without options) and an IPv6 one (without
// extension headers).
#define IP_OFF ETH_HLEN
#define IP4_SRC_OFF (IP_OFF + 12)
#define IP4_DST_OFF (IP_OFF + 16)
#define IP4_CSUM_OFF (IP_OFF + 10)
#define L4_OFF4 (ETH_HLEN + sizeof(struct iphdr))
#define IP6_SRC_OFF (IP_OFF + 8)
#define IP6_DST_OFF (IP_OFF + 24)
#define L4_OFF6 (ETH_HLEN + sizeof(struct ipv6hdr))

// A flow's addresses are 16 bytes in either family, IPv4 as
// ::ffff:a.b.c.d, as in every map.
struct flow {
	__u8 saddr[16];
	__u8 daddr[16];
	__be16 sport, dport;
	__u8 proto;
	__u8 v6;
	__u16 pad;
};

static __always_inline void addr_copy(__u8 *dst, const __u8 *src)
{
	__u32 *d = (__u32 *)dst;
	const __u32 *s = (const __u32 *)src;
	d[0] = s[0];
	d[1] = s[1];
	d[2] = s[2];
	d[3] = s[3];
}

static __always_inline int addr_eq(const __u8 *a, const __u8 *b)
{
	const __u32 *x = (const __u32 *)a, *y = (const __u32 *)b;
	return x[0] == y[0] && x[1] == y[1] && x[2] == y[2] && x[3] == y[3];
}

static __always_inline int addr_zero(const __u8 *a)
{
	const __u32 *x = (const __u32 *)a;
	return (x[0] | x[1] | x[2] | x[3]) == 0;
}

static __always_inline __be32 addr4(const __u8 *a) { return ((const __u32 *)a)[3]; }

static __always_inline int parse_l4(struct flow *f, struct l4ports *l4, __u8 proto)
{
	if (proto != IPPROTO_TCP && proto != IPPROTO_UDP)
		return 0;
	f->sport = l4->source;
	f->dport = l4->dest;
	f->proto = proto;
	return 1;
}

// parse reads a TCP or UDP packet: IPv4 without options or fragments, or
// IPv6 without extension headers (a fragment is one).
static __always_inline int parse(struct __sk_buff *skb, struct flow *f)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = data + IP_OFF;
		struct l4ports *l4 = data + L4_OFF4;
		if ((void *)(l4 + 1) > end || ip->ihl_version != 0x45 || (ip->frag_off & bpf_htons(0x3fff)))
			return 0;
		addr_set4(f->saddr, ip->saddr);
		addr_set4(f->daddr, ip->daddr);
		return parse_l4(f, l4, ip->protocol);
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = data + IP_OFF;
		struct l4ports *l4 = data + L4_OFF6;
		if ((void *)(l4 + 1) > end)
			return 0;
		addr_copy(f->saddr, (const __u8 *)ip6->saddr);
		addr_copy(f->daddr, (const __u8 *)ip6->daddr);
		f->v6 = 1;
		return parse_l4(f, l4, ip6->nexthdr);
	}
	return 0;
}

static __always_inline __u32 l4_off(struct flow *f)
{
	return f->v6 ? L4_OFF6 : L4_OFF4;
}

static __always_inline __u32 l4_csum_off(struct flow *f)
{
	return l4_off(f) + (f->proto == IPPROTO_TCP ? 16 : 6);
}

// set_ip rewrites the source (src true) or destination address, fixing
// the checksums: IPv4's header and, for both families, the L4 one over
// the pseudo-header.
static __always_inline int set_ip(struct __sk_buff *skb, struct flow *f, int src, const __u8 *old_ip,
				  const __u8 *new_ip)
{
	__u64 mangled = f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;
	__u32 csum = l4_csum_off(f);

	if (addr_eq(old_ip, new_ip))
		return 0;
	if (f->v6) {
		__s64 d = bpf_csum_diff((__be32 *)old_ip, 16, (__be32 *)new_ip, 16, 0);
		if (d < 0 || bpf_l4_csum_replace(skb, csum, 0, d, BPF_F_PSEUDO_HDR | mangled) ||
		    bpf_skb_store_bytes(skb, src ? IP6_SRC_OFF : IP6_DST_OFF, new_ip, 16, 0))
			return -1;
		return 0;
	}
	__be32 o = addr4(old_ip), n = addr4(new_ip);
	if (bpf_l4_csum_replace(skb, csum, o, n, BPF_F_PSEUDO_HDR | mangled | 4) ||
	    bpf_l3_csum_replace(skb, IP4_CSUM_OFF, o, n, 4) ||
	    bpf_skb_store_bytes(skb, src ? IP4_SRC_OFF : IP4_DST_OFF, &n, 4, 0))
		return -1;
	return 0;
}

// set_addr rewrites the source (src true) or destination address and
// port, fixing the checksums.
static __always_inline int set_addr(struct __sk_buff *skb, struct flow *f, int src, const __u8 *old_ip,
				    const __u8 *new_ip, __be16 old_port, __be16 new_port)
{
	__u64 mangled = f->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0;

	if (set_ip(skb, f, src, old_ip, new_ip))
		return -1;
	if (old_port != new_port) {
		if (bpf_l4_csum_replace(skb, l4_csum_off(f), old_port, new_port, mangled | 2) ||
		    bpf_skb_store_bytes(skb, l4_off(f) + (src ? 0 : 2), &new_port, 2, 0))
			return -1;
	}
	return 0;
}

// forward sends the rewritten packet out of the interface its new
// destination is routed through; without a route it goes up the stack.
static __always_inline int forward(struct __sk_buff *skb, struct flow *f, const __u8 *saddr, const __u8 *daddr)
{
	struct bpf_fib_lookup p = {};

	if (f->v6) {
		p.family = AF_INET6;
		addr_copy((__u8 *)p.ipv6_src, saddr);
		addr_copy((__u8 *)p.ipv6_dst, daddr);
	} else {
		p.family = AF_INET;
		p.ipv4_src = addr4(saddr);
		p.ipv4_dst = addr4(daddr);
	}
	p.ifindex = skb->ingress_ifindex;
	long rc = bpf_fib_lookup(skb, &p, sizeof(p), 0);
	if (rc == BPF_FIB_LKUP_RET_SUCCESS || rc == BPF_FIB_LKUP_RET_NO_NEIGH)
		return bpf_redirect_neigh(p.ifindex, 0, 0, 0);
	return TC_ACT_OK;
}

static __always_inline void ct_key_of(struct ct_key *k, const __u8 *s, __be16 sp, const __u8 *d, __be16 dp,
				      __u8 proto)
{
	addr_copy(k->saddr, s);
	addr_copy(k->daddr, d);
	k->sport = sp;
	k->dport = dp;
	k->proto = proto;
}

// reverse translates a reply of a flow this program translated.
static __always_inline int reverse(struct __sk_buff *skb, struct flow *f)
{
	struct ct_key k = {};

	ct_key_of(&k, f->saddr, f->sport, f->daddr, f->dport, f->proto);
	struct ct_rev_val *r = bpf_map_lookup_elem(&ct_rev_v1, &k);
	if (!r)
		return TC_ACT_UNSPEC;
	if (set_addr(skb, f, 1, f->saddr, r->faddr, f->sport, r->fport) ||
	    set_addr(skb, f, 0, f->daddr, r->caddr, f->dport, r->cport))
		return TC_ACT_SHOT;
	return forward(skb, f, r->faddr, r->caddr);
}

static __always_inline __u32 mix(__u32 h, __u32 v)
{
	h ^= v;
	h *= 0x9e3779b1;
	return h ^ (h >> 15);
}

// mix_addr mixes an address into h: the IPv4 part alone for IPv4 (the
// same hash as when the flow held 4-byte addresses), every word for IPv6.
static __always_inline __u32 mix_addr(__u32 h, const __u8 *a, int v6)
{
	const __u32 *w = (const __u32 *)a;
	h = mix(h, w[3]);
	if (v6) {
		h = mix(h, w[0]);
		h = mix(h, w[1]);
		h = mix(h, w[2]);
	}
	return h;
}

static __always_inline __u32 flow_hash(struct flow *f, struct svc_val *fe)
{
	__u32 h = mix_addr(0x5bd1e995, f->saddr, f->v6);
	if (!(fe->flags & FE_AFFINITY)) {
		h = mix_addr(h, f->daddr, f->v6);
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
	struct maglev_table *t = bpf_map_lookup_elem(&maglev_v2, &svc);
	if (t) {
		__u32 idx = h % MAGLEV_M;
		// Keep the compiler from dropping the bound the verifier needs.
		asm volatile("" : "+r"(idx));
		if (idx >= MAGLEV_M)
			return 0;
		__u32 id = t->ids[idx];
		return bpf_map_lookup_elem(&backends_v2, &id);
	}
	return lb_slot(key, h % fe->count + 1);
}

// snat_port finds a source port on the node for a new SNATed flow: the
// client's own when no other flow to that backend uses it.
static __always_inline __be16 snat_port(struct flow *f, const __u8 *naddr, const __u8 *baddr, __be16 bport)
{
	struct ct_key k = {};
	__u16 port = bpf_ntohs(f->sport);

	for (int i = 0; i < 8; i++) {
		ct_key_of(&k, baddr, bport, naddr, bpf_htons(port), f->proto);
		if (!bpf_map_lookup_elem(&ct_rev_v1, &k))
			return bpf_htons(port);
		port = 32768 + (mix(port, addr4(f->saddr) + i) % 28232);
	}
	return 0;
}

static __always_inline int srcrange_ok(struct svc_val *fe, const __u8 *saddr)
{
	struct srcrange_key k = {.prefixlen = 32 + 128, .svc = fe->id};

	addr_copy(k.addr, saddr);
	return bpf_map_lookup_elem(&srcrange_v2, &k) != 0;
}

// snat_of is the address a new flow leaves with: the client's (policy
// Local), the node address it reached (a NodePort), or the family's SNAT
// address. 0: none set for the family.
static __always_inline const __u8 *snat_of(struct flow *f, struct svc_val *fe, int nodeport)
{
	if (fe->flags & FE_LOCAL)
		return f->saddr;
	if (nodeport)
		return f->daddr;
	__u32 fam = f->v6 ? SNAT_V6 : SNAT_V4;
	struct snat_addr *sa = bpf_map_lookup_elem(&snat_v2, &fam);
	if (!sa || addr_zero(sa->addr))
		return 0;
	return sa->addr;
}

// new_flow picks a backend for a flow's first packet and records it.
static __always_inline struct ct_fwd_val *new_flow(struct flow *f, struct ct_key *fk, struct svc_key *key,
						   struct svc_val *fe, int nodeport)
{
	struct ct_fwd_val fv = {};
	struct ct_rev_val rv = {};
	struct backend *be = pick(f, key, fe);
	// A backend of the other family cannot take this packet.
	if (!be || addr_is4(be->addr) == f->v6)
		return 0;
	const __u8 *naddr = snat_of(f, fe, nodeport);
	if (!naddr)
		return 0;
	addr_copy(fv.baddr, be->addr);
	fv.bport = be->port;
	addr_copy(fv.naddr, naddr);
	fv.nport = f->sport;
	if (!(fe->flags & FE_LOCAL)) {
		fv.nport = snat_port(f, fv.naddr, fv.baddr, fv.bport);
		if (!fv.nport)
			return 0;
	}
	addr_copy(rv.faddr, f->daddr);
	rv.fport = f->dport;
	addr_copy(rv.caddr, f->saddr);
	rv.cport = f->sport;
	struct ct_key rk = {};
	ct_key_of(&rk, fv.baddr, fv.bport, fv.naddr, fv.nport, f->proto);
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
// unreachable (ICMPv6 for IPv6) from the address it was sent to, quoting
// its IP header and first 8 bytes, sent back out of the interface it came
// in on.
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

struct icmp6_unreach {
	__u16 align;
	struct ethhdr eth;
	struct ipv6hdr ip;
	__u8 type;
	__u8 code;
	__u16 check;
	__u32 unused;
	__u8 quote[sizeof(struct ipv6hdr) + 8];
};

#define ICMP6_UNREACH_LEN (sizeof(struct icmp6_unreach) - 2)
#define ICMP6_BODY_LEN (8 + sizeof(struct ipv6hdr) + 8)

static __always_inline int reply_out(struct __sk_buff *skb, void *frame, __u32 len)
{
	if (bpf_skb_change_tail(skb, len, 0) || bpf_skb_store_bytes(skb, 0, frame, len, 0))
		return TC_ACT_SHOT;
	return bpf_redirect(skb->ingress_ifindex, 0);
}

static __attribute__((noinline)) int port_unreachable4(struct __sk_buff *skb)
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
	return reply_out(skb, &r.eth, ICMP_UNREACH_LEN);
}

static __attribute__((noinline)) int port_unreachable6(struct __sk_buff *skb)
{
	struct icmp6_unreach r = {};
	struct ethhdr eth;

	if (bpf_skb_load_bytes(skb, 0, &eth, sizeof(eth)) ||
	    bpf_skb_load_bytes(skb, IP_OFF, r.quote, sizeof(r.quote)))
		return TC_ACT_SHOT;
	struct ipv6hdr *orig = (struct ipv6hdr *)r.quote;
	__builtin_memcpy(r.eth.h_dest, eth.h_source, 6);
	__builtin_memcpy(r.eth.h_source, eth.h_dest, 6);
	r.eth.h_proto = bpf_htons(ETH_P_IPV6);
	r.ip.version_tc = 0x60;
	r.ip.payload_len = bpf_htons(ICMP6_BODY_LEN);
	r.ip.nexthdr = IPPROTO_ICMPV6;
	r.ip.hop_limit = 64;
	addr_copy((__u8 *)r.ip.saddr, (const __u8 *)orig->daddr);
	addr_copy((__u8 *)r.ip.daddr, (const __u8 *)orig->saddr);
	r.type = 1; // destination unreachable
	r.code = 4; // port unreachable
	// The checksum covers the pseudo-header: both addresses, the length
	// and the next header.
	__be32 ph[2] = {bpf_htonl(ICMP6_BODY_LEN), bpf_htonl(IPPROTO_ICMPV6)};
	__s64 sum = bpf_csum_diff(0, 0, r.ip.saddr, 32, 0);
	sum = bpf_csum_diff(0, 0, ph, sizeof(ph), (__u32)sum);
	sum = bpf_csum_diff(0, 0, (__be32 *)&r.type, ICMP6_BODY_LEN, (__u32)sum);
	r.check = csum_fold(sum);
	return reply_out(skb, &r.eth, ICMP6_UNREACH_LEN);
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
	addr_copy(key.addr, f.daddr);
	struct svc_val *fe = lb_frontend(&key);
	if (!fe)
		return TC_ACT_UNSPEC;
	// The family's NodePort wildcard (::ffff:0.0.0.0 or ::) answered:
	// reached at a node address, which the flow is SNATed to.
	int nodeport = !addr_eq(key.addr, f.daddr);
	if ((fe->flags & FE_SRCRANGE) && !srcrange_ok(fe, f.saddr))
		return TC_ACT_SHOT;

	ct_key_of(&fk, f.saddr, f.sport, f.daddr, f.dport, f.proto);
	struct ct_fwd_val *fv = bpf_map_lookup_elem(&ct_fwd_v1, &fk);
	if (!fv) {
		if (fe->count == 0) {
			if (!(fe->flags & FE_REJECT))
				return TC_ACT_SHOT;
			return f.v6 ? port_unreachable6(skb) : port_unreachable4(skb);
		}
		fv = new_flow(&f, &fk, &key, fe, nodeport);
		if (!fv)
			return TC_ACT_SHOT;
	}
	if (set_addr(skb, &f, 0, f.daddr, fv->baddr, f.dport, fv->bport) ||
	    set_addr(skb, &f, 1, f.saddr, fv->naddr, f.sport, fv->nport))
		return TC_ACT_SHOT;
	return forward(skb, &f, fv->naddr, fv->baddr);
}

char _license[] SEC("license") = "Dual BSD/GPL";
