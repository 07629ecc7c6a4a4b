/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service networks (sl_svcnet_v1): the cluster's ServiceCIDRs and the
 * ClusterIPs allocated in them, as kube-proxy nftables' cluster-ips-check
 * chain knows them. A new flow that no frontend matched is refused when its
 * destination is a service address: to a port of an allocated ClusterIP that
 * no Service defines, it is rejected (the client learns at once); to an
 * address of a ServiceCIDR that no Service holds, it is dropped. Without
 * this such traffic follows the node's routes out of the cluster.
 *
 * One LPM trie serves both families: an IPv4 address is keyed as
 * ::ffff:a.b.c.d, a v4 CIDR of n bits with prefix length 96 + n. */
#pragma once

#include "common.h"
#include "consts.h"

enum svcnet_kind : __u32 {
	SVCNET_NONE = 0,	/* not a service address (no entry) */
	SVCNET_CLUSTER_IP = 1,	/* an allocated ClusterIP: undefined ports rejected */
	SVCNET_RANGE = 2,	/* a ServiceCIDR: unallocated addresses dropped */
};

struct svcnet_key {
	__u32 prefixlen;	/* host order: 128 for a ClusterIP; 96 + bits
				 * for an IPv4 CIDR, bits for an IPv6 one */
	__u8 addr[16];		/* network order; IPv4 as ::ffff:a.b.c.d */
};
ASSERT_SIZE(struct svcnet_key, 20);

struct svcnet_value {
	enum svcnet_kind kind;	/* host order */
};
ASSERT_SIZE(struct svcnet_value, 4);

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_SVCNET_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);	/* memory follows the entries */
	__type(key, struct svcnet_key);
	__type(value, struct svcnet_value);
} sl_svcnet_v1 SEC(".maps");

/* svcnet_lookup: the kind of the most specific entry holding key's address. */
static __always_inline enum svcnet_kind svcnet_lookup(struct svcnet_key *key)
{
	struct svcnet_value *v;

	key->prefixlen = 128;
	v = bpf_map_lookup_elem(&sl_svcnet_v1, key);
	return v ? v->kind : SVCNET_NONE;
}

/* svcnet_kind4 and svcnet_kind6 are functions of their own: they are asked
 * only of new flows no frontend matched, and their key must not add to the
 * frames of the pipelines' deepest call chains. */
__subprog enum svcnet_kind svcnet_kind4(__be32 addr)
{
	struct svcnet_key key = {};

	key.addr[10] = 0xff;
	key.addr[11] = 0xff;
	__builtin_memcpy(&key.addr[12], &addr, 4);
	return svcnet_lookup(&key);
}

__subprog enum svcnet_kind svcnet_kind6(const __u8 *addr)
{
	struct svcnet_key key;

	__builtin_memcpy(key.addr, addr, 16);
	return svcnet_lookup(&key);
}
