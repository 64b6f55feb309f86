//go:build ignore

// sock.c: socket-level Service load balancing for every process of a
// cgroup v2 (the node's pods and the node itself). connect and sendmsg
// rewrite a Service address to a backend before any packet exists;
// recvmsg and getpeername rewrite it back, so applications only ever see
// the Service address. Nothing here runs per packet.

#include "lb.h"
#include "revnat.h"

// ClientIP session affinity. The source address is unknown at connect
// time, so the client is its network namespace (one per pod).
struct affinity_key {
	__u64 netns;
	__u32 svc;
	__u32 pad;
};

struct affinity_val {
	__u64 last; // ktime ns
	__u32 backend;
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct affinity_key);
	__type(value, struct affinity_val);
} affinity_v2 SEC(".maps");

#define SYS_REJECT 0
#define SYS_PROCEED 1

// pick chooses the backend of the frontend fe at key: the one this client
// used within the affinity timeout if it is still there, else a random
// slot.
static __always_inline struct backend *pick(void *ctx, struct svc_key *key, struct svc_val *fe)
{
	struct affinity_key ak = {};
	struct affinity_val *av;
	struct backend *be;
	__u64 now = 0;

	if (fe->flags & FE_AFFINITY) {
		ak.netns = bpf_get_netns_cookie(ctx);
		ak.svc = fe->id;
		now = bpf_ktime_get_ns();
		av = bpf_map_lookup_elem(&affinity_v2, &ak);
		if (av && now - av->last <= (__u64)fe->affinity * 1000000000ULL) {
			__u32 id = av->backend;
			be = bpf_map_lookup_elem(&backends_v2, &id);
			// A backend id belongs to one service; ids are not reused
			// soon, and the svc check covers the rest.
			if (be && be->svc == fe->id) {
				av->last = now;
				return be;
			}
		}
	}

	__u16 n = bpf_get_prandom_u32() % fe->count + 1;
	key->slot = n;
	struct svc_val *slot = bpf_map_lookup_elem(&services_v2, key);
	key->slot = 0;
	if (!slot)
		return 0;
	__u32 id = slot->id;
	be = bpf_map_lookup_elem(&backends_v2, &id);
	if (be && (fe->flags & FE_AFFINITY)) {
		struct affinity_val nv = {.last = now, .backend = id};
		bpf_map_update_elem(&affinity_v2, &ak, &nv, BPF_ANY);
	}
	return be;
}

// xlate translates the destination in key (slot 0 filled in) to a
// backend, records the reverse translation and returns the backend; *ret
// is what the hook returns when it returns 0 (NULL with *ret PROCEED: not a
// Service).
static __always_inline struct backend *xlate(void *ctx, struct svc_key *key, int *ret)
{
	struct revnat_val orig = {};
	__builtin_memcpy(orig.addr, key->addr, 16);
	orig.port = key->port;

	*ret = SYS_PROCEED;
	struct svc_val *fe = lb_frontend(key);
	if (!fe)
		return 0;
	*ret = SYS_REJECT;
	if (fe->count == 0) {
		bpf_set_retval(fe->flags & FE_REJECT ? -ECONNREFUSED : -EHOSTUNREACH);
		return 0;
	}
	struct backend *be = pick(ctx, key, fe);
	if (!be) {
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	}
	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = be->port};
	__builtin_memcpy(rk.addr, be->addr, 16);
	bpf_map_update_elem(&revnat_v1, &rk, &orig, BPF_ANY);
	return be;
}

static __always_inline int sock4_fwd(struct bpf_sock_addr *ctx)
{
	struct svc_key key = {.port = (__be16)ctx->user_port, .proto = ctx->protocol, .scope = SCOPE_SOCK};
	int ret;

	addr_set4(key.addr, ctx->user_ip4);
	struct backend *be = xlate(ctx, &key, &ret);
	if (!be)
		return ret;
	ctx->user_ip4 = ((__u32 *)be->addr)[3];
	ctx->user_port = be->port;
	return SYS_PROCEED;
}

static __always_inline int sock6_fwd(struct bpf_sock_addr *ctx)
{
	struct svc_key key = {.port = (__be16)ctx->user_port, .proto = ctx->protocol, .scope = SCOPE_SOCK};
	__u32 *w = (__u32 *)key.addr;
	int ret;

	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	struct backend *be = xlate(ctx, &key, &ret);
	if (!be)
		return ret;
	const __u32 *b = (const __u32 *)be->addr;
	ctx->user_ip6[0] = b[0];
	ctx->user_ip6[1] = b[1];
	ctx->user_ip6[2] = b[2];
	ctx->user_ip6[3] = b[3];
	ctx->user_port = be->port;
	return SYS_PROCEED;
}

static __always_inline struct revnat_val *revnat(void *ctx, const __u8 *addr, __u32 port)
{
	struct revnat_key rk = {.cookie = bpf_get_socket_cookie(ctx), .port = (__be16)port};
	__builtin_memcpy(rk.addr, addr, 16);
	return bpf_map_lookup_elem(&revnat_v1, &rk);
}

static __always_inline int sock4_rev(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];

	addr_set4(addr, ctx->user_ip4);
	struct revnat_val *v = revnat(ctx, addr, ctx->user_port);
	if (v) {
		ctx->user_ip4 = ((__u32 *)v->addr)[3];
		ctx->user_port = v->port;
	}
	return SYS_PROCEED;
}

static __always_inline int sock6_rev(struct bpf_sock_addr *ctx)
{
	__u8 addr[16];
	__u32 *w = (__u32 *)addr;

	w[0] = ctx->user_ip6[0];
	w[1] = ctx->user_ip6[1];
	w[2] = ctx->user_ip6[2];
	w[3] = ctx->user_ip6[3];
	struct revnat_val *v = revnat(ctx, addr, ctx->user_port);
	if (v) {
		const __u32 *a = (const __u32 *)v->addr;
		ctx->user_ip6[0] = a[0];
		ctx->user_ip6[1] = a[1];
		ctx->user_ip6[2] = a[2];
		ctx->user_ip6[3] = a[3];
		ctx->user_port = v->port;
	}
	return SYS_PROCEED;
}

SEC("cgroup/connect4")
int sock4_connect(struct bpf_sock_addr *ctx) { return sock4_fwd(ctx); }

SEC("cgroup/sendmsg4")
int sock4_sendmsg(struct bpf_sock_addr *ctx) { return sock4_fwd(ctx); }

SEC("cgroup/recvmsg4")
int sock4_recvmsg(struct bpf_sock_addr *ctx) { return sock4_rev(ctx); }

SEC("cgroup/getpeername4")
int sock4_getpeername(struct bpf_sock_addr *ctx) { return sock4_rev(ctx); }

SEC("cgroup/connect6")
int sock6_connect(struct bpf_sock_addr *ctx) { return sock6_fwd(ctx); }

SEC("cgroup/sendmsg6")
int sock6_sendmsg(struct bpf_sock_addr *ctx) { return sock6_fwd(ctx); }

SEC("cgroup/recvmsg6")
int sock6_recvmsg(struct bpf_sock_addr *ctx) { return sock6_rev(ctx); }

SEC("cgroup/getpeername6")
int sock6_getpeername(struct bpf_sock_addr *ctx) { return sock6_rev(ctx); }

char _license[] SEC("license") = "Dual BSD/GPL";
