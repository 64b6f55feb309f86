//go:build ignore

// lb.h: the Service maps shared by the socket and the tc programs.
//
// Layout (after Cilium's): a Service frontend is a run of entries in the
// services map under one {address, port, protocol, scope}: slot 0 holds the
// backend count and the service id, slots 1..count hold backend ids.
// Backends live in their own map by id. A reader picks slot
// random % count + 1, so slot 0 is the single commit point: userspace writes
// new backends, then slots, then slot 0, and deletes in the reverse order;
// one endpoint change touches only that Service's entries.
//
// Addresses are 16 bytes everywhere, IPv4 as ::ffff:a.b.c.d, so the IPv6
// hooks share these maps and dual-stack only adds entries. The map names
// carry a layout version: a new layout gets new pins and the old ones are
// removed once the programs using the new maps are attached.
//
// v2 (services, backends, the affinity, Maglev and source-range maps): the
// IPv4 NodePort wildcard is ::ffff:0.0.0.0; v1 keyed it at ::, the IPv6
// wildcard now, so a v1 entry read by these programs would send IPv6
// NodePort clients to IPv4 backends. The maps naming service and backend
// ids move together: an id means something only within one set. The flow
// maps (addresses only), node addresses and revnat keep v1.
#ifndef PODNET_LB_H
#define PODNET_LB_H

#include "podnet.h"

// Scopes of a frontend: who is asking.
#define SCOPE_SOCK 0 // pods and the node itself (socket LB)
#define SCOPE_EXT 1  // traffic from outside the node (tc)

// Frontend flags (slot 0).
#define FE_REJECT 1   // no usable endpoint anywhere: refuse
#define FE_AFFINITY 2 // ClientIP session affinity
#define FE_SRCRANGE 4 // load-balancer IP with loadBalancerSourceRanges
#define FE_LOCAL 8    // externalTrafficPolicy Local: keep the client address

struct svc_key {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 scope;
	__u16 slot;
	__u16 pad;
};

struct svc_val {
	__u32 id;       // slot 0: service id; slot n: backend id
	__u16 count;    // slot 0: number of backend slots
	__u8 flags;     // slot 0: FE_*
	__u8 pad;
	__u32 affinity; // slot 0: session affinity timeout in seconds
};

struct backend {
	__u8 addr[16];
	__be16 port;
	__u8 proto;
	__u8 pad;
	__u32 svc; // the service id this backend belongs to
};

struct nodeaddr_key {
	__u8 addr[16];
};

// Preallocated: a full load of 10,000 Services × 10 endpoints (210,000
// entries in both maps) takes 0.39 s of CPU against 0.58 s with
// BPF_F_NO_PREALLOC, which allocates every element on update. The price is
// memory held up front, ~26 and ~24 MiB for 2^18 entries each, room for
// ~23,000 such Services (BENCHMARKS.md, Service proxy).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, struct svc_key);
	__type(value, struct svc_val);
} services_v2 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 18);
	__type(key, __u32);
	__type(value, struct backend);
} backends_v2 SEC(".maps");

// The node's own addresses, where NodePorts answer.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, struct nodeaddr_key);
	__type(value, __u8);
} nodeaddrs_v1 SEC(".maps");

static __always_inline void addr_set4(__u8 *addr, __be32 ip4)
{
	__u32 *w = (__u32 *)addr;
	w[0] = 0;
	w[1] = 0;
	w[2] = bpf_htonl(0xffff);
	w[3] = ip4;
}

static __always_inline int addr_is4(const __u8 *addr)
{
	const __u32 *w = (const __u32 *)addr;
	return w[0] == 0 && w[1] == 0 && w[2] == bpf_htonl(0xffff);
}

// lb_frontend finds the frontend (slot 0) for key, trying the NodePort
// wildcard of the address's family when the address is one of the node's:
// ::ffff:0.0.0.0 for IPv4, :: for IPv6, so a dual-stack Service's two
// ports (one per family, each with its own endpoints) both hold the
// NodePort. key->slot must be 0.
static __always_inline struct svc_val *lb_frontend(struct svc_key *key)
{
	struct svc_val *fe = bpf_map_lookup_elem(&services_v2, key);
	if (fe)
		return fe;
	if (!bpf_map_lookup_elem(&nodeaddrs_v1, key->addr))
		return 0;
	int is4 = addr_is4(key->addr);
	__builtin_memset(key->addr, 0, sizeof(key->addr));
	if (is4)
		addr_set4(key->addr, 0);
	return bpf_map_lookup_elem(&services_v2, key);
}

// lb_slot returns the backend in slot n (1-based) of the frontend at key.
static __always_inline struct backend *lb_slot(struct svc_key *key, __u16 n)
{
	key->slot = n;
	struct svc_val *v = bpf_map_lookup_elem(&services_v2, key);
	key->slot = 0;
	if (!v)
		return 0;
	return bpf_map_lookup_elem(&backends_v2, &v->id);
}

#endif
