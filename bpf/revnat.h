// revnat.h: what socket LB translated a socket from, by socket cookie and
// backend. sock.c writes it; recvmsg and getpeername read it (UDP replies
// must come from the address the client sent to, or resolvers drop them);
// sockterm.c reads it to find sockets pinned to a removed backend. Both
// objects share the one pinned map.

#ifndef PODNET_REVNAT_H
#define PODNET_REVNAT_H

#include "podnet.h"

struct revnat_key {
	__u64 cookie;
	__u8 addr[16];
	__be16 port;
	__u16 pad[3];
};

struct revnat_val {
	__u8 addr[16];
	__be16 port;
	__u16 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1 << 16);
	__type(key, struct revnat_key);
	__type(value, struct revnat_val);
} revnat_v1 SEC(".maps");

#endif
