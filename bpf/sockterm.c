//go:build ignore

// sockterm.c: destroys connected UDP sockets that socket LB pinned to a
// backend that is gone. A connected UDP socket is translated once, at
// connect; without this it would keep sending to the removed endpoint and
// hear nothing. Destroyed, its owner gets an error (ECONNABORTED) and can
// dial again. Unconnected sockets are never touched (each sendto is
// translated anew, and destroying them would only take their port away).
//
// Userspace fills term_v1 with the removed backends, then runs this
// iterator once in every network namespace of the cgroup's processes: an
// iterator sees the sockets of the namespace it is created in.

#include "podnet.h"
#include "revnat.h"

// Kernel types, relocated by CO-RE: only the fields read are declared.
struct sock_common {
	__be32 skc_daddr;
	__be16 skc_dport;
	unsigned short skc_family;
	volatile unsigned char skc_state;
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


// Removed backends, {address, port} with the address in the maps' 16-byte
// form.
struct term_key {
	__u8 addr[16];
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1 << 12);
	__type(key, struct term_key);
	__type(value, __u8);
} term_v1 SEC(".maps");

SEC("iter/udp")
int sock_term_udp(struct bpf_iter__udp *ctx)
{
	struct sock *sk = (struct sock *)ctx->udp_sk;
	struct term_key tk = {};
	struct revnat_key rk = {};

	if (!sk || sk->__sk_common.skc_family != AF_INET || sk->__sk_common.skc_state != TCP_ESTABLISHED)
		return 0;
	__u32 *w = (__u32 *)tk.addr;
	w[2] = bpf_htonl(0xffff);
	w[3] = sk->__sk_common.skc_daddr;
	tk.port = sk->__sk_common.skc_dport;
	if (!bpf_map_lookup_elem(&term_v1, &tk))
		return 0;
	// Only sockets socket LB translated: one connected to the pod address
	// itself is the application's business.
	rk.cookie = sk->__sk_common.skc_cookie.counter;
	__builtin_memcpy(rk.addr, tk.addr, 16);
	rk.port = tk.port;
	if (!bpf_map_lookup_elem(&revnat_v1, &rk))
		return 0;
	bpf_sock_destroy((struct sock_common *)sk);
	return 0;
}

char _license[] SEC("license") = "Dual BSD/GPL";
