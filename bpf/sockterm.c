//go:build ignore

// sockterm.c: destroys connected UDP sockets that socket LB pinned to a
// destination that is gone: a backend no Service uses any more, or one a
// frontend no longer sends to (a targetPort change, an endpoint leaving
// one Service while another still uses it). A connected UDP socket is
// translated once, at connect; without this it would keep sending to the
// old address and port and hear nothing. Destroyed, its owner gets an error
// (ECONNABORTED) and can dial again. Unconnected sockets are never touched
// (each sendto is translated anew, and destroying them would only take
// their port away).
//
// Userspace fills term_v2 with the {frontend, backend} pairs that left,
// then runs this iterator once in every network namespace of the cgroup's
// processes: an iterator sees the sockets of the namespace it is created
// in. Both families: an IPv4 socket's peer is read in the maps' 16-byte
// form, an IPv6 socket's (IPv4-mapped or not) as it is.

#include "podnet.h"
#include "revnat.h"

// Kernel types, relocated by CO-RE: only the fields read are declared.
struct in6_addr {
	union {
		__u8 u6_addr8[16];
	} in6_u;
} __attribute__((preserve_access_index));

struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
	struct in6_addr skc_v6_daddr;
	struct {
		__s64 counter;
	} skc_cookie;
} __attribute__((preserve_access_index));

struct sock {
	struct sock_common __sk_common;
} __attribute__((preserve_access_index));

struct udp_sock;

struct bpf_iter_meta;

struct bpf_iter__udp {
	struct bpf_iter_meta *meta;
	struct udp_sock *udp_sk;
} __attribute__((preserve_access_index));

extern int bpf_sock_destroy(struct sock_common *sk) __ksym;

#define TCP_ESTABLISHED 1 // a connected UDP socket's state

// A destination that left: the backend, and the frontend that no longer
// sends to it, addresses in the maps' 16-byte form. A frontend of address
// zero is a NodePort at any node address; one of port zero too, any
// frontend (the backend is gone from every Service).
struct term_key {
	__u8 backend[16];
	__u8 frontend[16];
	__be16 bport;
	__be16 fport;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 12);
	__type(key, struct term_key);
	__type(value, __u8);
} term_v2 SEC(".maps");

// peer reads sk's connected peer into rk's address and port (rk zeroed
// by the caller); 0 for a socket not connected, or of another family.
static __always_inline int peer(struct sock *sk, struct revnat_key *rk)
{
	if (sk->__sk_common.skc_state != TCP_ESTABLISHED)
		return 0;
	switch (sk->__sk_common.skc_family) {
	case AF_INET: {
		__u32 *w = (__u32 *)rk->addr;
		w[2] = bpf_htonl(0xffff);
		w[3] = sk->__sk_common.skc_daddr;
		break;
	}
	case AF_INET6:
		bpf_probe_read_kernel(rk->addr, 16, sk->__sk_common.skc_v6_daddr.in6_u.u6_addr8);
		break;
	default:
		return 0;
	}
	rk->port = sk->__sk_common.skc_dport;
	return 1;
}

SEC("iter/udp")
int sock_term_udp(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;
	struct revnat_key rk = {};
	struct term_key tk = {};

	if (!sk || !peer(sk, &rk))
		return 0;
	// Only sockets socket LB translated (their frontend is in revnat): one
	// connected to the pod address itself is the application's business.
	rk.cookie = sk->__sk_common.skc_cookie.counter;
	struct revnat_val *fe = bpf_map_lookup_elem(&revnat_v1, &rk);
	if (!fe)
		return 0;
	__builtin_memcpy(tk.backend, rk.addr, 16);
	tk.bport = rk.port;
	__builtin_memcpy(tk.frontend, fe->addr, 16);
	tk.fport = fe->port;
	if (bpf_map_lookup_elem(&term_v2, &tk))
		goto destroy;
	__builtin_memset(tk.frontend, 0, 16);
	if (bpf_map_lookup_elem(&term_v2, &tk))
		goto destroy;
	tk.fport = 0;
	if (!bpf_map_lookup_elem(&term_v2, &tk))
		return 0;
destroy:
	bpf_sock_destroy((struct sock_common *)sk);
	return 0;
}

char _license[] SEC("license") = "Dual BSD/GPL";
