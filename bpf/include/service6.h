/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 service maps and the node's IPv6 settings: the twins of service.h's
 * and config.h's maps with 16-byte addresses. The frontend value (struct
 * fe_value), the backend key, the service ids and the consistency rule for
 * writers are shared with IPv4: a dual-stack Service is one service port per
 * family, each with its own id, and its IPv6 frontends point at IPv6 backends
 * only. */
#pragma once

#include "common.h"
#include "config.h"
#include "consts.h"
#include "ipv6.h"
#include "service.h"

struct fe6_key {
	__u8 addr[16];		/* network order: service IP, or all ones (the
				 * NodePort wildcard, as FE_WILDCARD_ADDR) */
	__be16 port;		/* network order; 0 with proto ICMPv6 marks a service
				 * IP whose echo requests are answered */
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP / IPPROTO_ICMPV6 */
	__u8 pad;		/* 0 */
};
ASSERT_SIZE(struct fe6_key, 20);

struct be6_value {
	__u8 addr[16];		/* network order */
	__be16 port;		/* network order */
	enum be_flags flags;
	__u8 pad;		/* 0 */
};
ASSERT_SIZE(struct be6_value, 20);

struct srcrange6_key {
	__u32 prefixlen;	/* host order: 32 + CIDR bits (LPM trie prefix) */
	__be32 svc_id;		/* network order, so the trie compares it first */
	__u8 src[16];		/* network order: the CIDR's address */
};
ASSERT_SIZE(struct srcrange6_key, 24);

struct aff6_key {
	__u32 svc_id;		/* host order */
	__u8 client[16];	/* network order: the client's source address */
};
ASSERT_SIZE(struct aff6_key, 20);

struct aff6_value {
	__u64 ts;		/* host order: sl_now() of the client's last
				 * new flow to the service */
	__u8 addr[16];		/* network order: the chosen backend */
	__be16 port;		/* network order */
	enum be_flags flags;	/* of the backend */
	__u8 pad;		/* 0 */
	__u32 ordinal;		/* host order: the backend's ordinal when chosen */
};
ASSERT_SIZE(struct aff6_value, 32);

struct hostip6_key {
	__u8 addr[16];		/* network order: an IPv6 address of this node */
};
ASSERT_SIZE(struct hostip6_key, 16);

/* The node's IPv6 settings; the family-neutral ones (SNAT port range, flags,
 * the host namespace) are sl_config_v1's. */
struct config6 {
	__u8 node_ip[16];	/* network order: source of SNATed IPv6 flows; all
				 * zero disables SNAT, as config.node_ip 0 */
	__u8 cluster_net[16];	/* network order: the cluster's IPv6 pod CIDR,
				 * masked; with cluster_mask all zero it is unset */
	__u8 cluster_mask[16];	/* network order */
};
ASSERT_SIZE(struct config6, 48);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config6);
} sl_config6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_HOSTIP_MAX);
	__type(key, struct hostip6_key);
	__type(value, struct hostip_value);
} sl_hostip6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_FE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct fe6_key);
	__type(value, struct fe_value);
} sl_fe6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_BE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct be_key);
	__type(value, struct be6_value);
} sl_be6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_SRCRANGE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct srcrange6_key);
	__type(value, struct srcrange_value);
} sl_srcrange6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_AFF_MAX);
	__type(key, struct aff6_key);
	__type(value, struct aff6_value);
} sl_aff6_v1 SEC(".maps");

static __always_inline struct config6 *config6_get(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_config6_v1, &zero);
}

static __always_inline int is_host_ip6(const __u8 *addr)
{
	struct hostip6_key key;

	addr6_copy(key.addr, addr);
	return bpf_map_lookup_elem(&sl_hostip6_v1, &key) != NULL;
}

static __always_inline struct fe_value *fe6_lookup(const __u8 *addr, __be16 port, __u8 proto)
{
	struct fe6_key key = { .port = port, .proto = proto };

	addr6_copy(key.addr, addr);
	struct fe_value *fe = bpf_map_lookup_elem(&sl_fe6_v1, &key);
	if (fe || !is_host_ip6(addr))
		return fe;
	__builtin_memset(key.addr, 0xff, sizeof(key.addr));
	return bpf_map_lookup_elem(&sl_fe6_v1, &key);
}

/* is_service_ip6: the syncer marks every IPv6 service IP with an ICMPv6
 * frontend. */
static __always_inline int is_service_ip6(const __u8 *addr)
{
	struct fe6_key key = { .proto = IPPROTO_ICMPV6 };

	addr6_copy(key.addr, addr);
	return bpf_map_lookup_elem(&sl_fe6_v1, &key) != NULL;
}

static __always_inline int src_allowed6(const struct fe_value *fe, const __u8 *src)
{
	struct srcrange6_key key = {
		.prefixlen = 32 + 128,	/* the whole key: svc_id, then src */
		.svc_id = bpf_htonl(fe->svc_id),
	};

	if (!(fe->flags & FE_SRC_RANGES))
		return 1;
	addr6_copy(key.src, src);
	return bpf_map_lookup_elem(&sl_srcrange6_v1, &key) != NULL;
}

/* pick_backend6: pick_backend (service.h) for an IPv6 client. */
static __always_inline int pick_backend6(const struct fe_value *fe, const __u8 *client, __be16 sport, int by_flow,
					 int local_only, struct be6_value *out, __u32 *ordinal)
{
	__u32 n = local_only ? fe->local_count : fe->count;
	struct aff6_key akey = { .svc_id = fe->svc_id };
	__u64 now = sl_now();

	if (fe->count == 0)
		return PICK_NO_ENDPOINTS;
	if (n == 0)
		return PICK_NO_LOCAL;

	addr6_copy(akey.client, client);
	if (fe->affinity_timeout) {
		struct aff6_value *a = bpf_map_lookup_elem(&sl_aff6_v1, &akey);
		if (a && now - a->ts < (__u64)fe->affinity_timeout * NS_PER_SEC &&
		    (!local_only || (a->flags & BE_LOCAL))) {
			a->ts = now; /* kube-proxy's timeout counts from the last new flow */
			addr6_copy(out->addr, a->addr);
			out->port = a->port;
			out->flags = a->flags;
			*ordinal = a->ordinal;
			return PICK_OK;
		}
	}

	__u32 first = local_only ? 0 : fe->cluster_start;
	struct be_key bkey = { .svc_id = fe->svc_id, .ordinal = first + bpf_get_prandom_u32() % n };
	if (by_flow && (fe->flags & FE_MAGLEV) && !local_only)
		maglev_pick(fe->svc_id, maglev_hash6(client, sport), first, n, &bkey.ordinal);
	struct be6_value *be = bpf_map_lookup_elem(&sl_be6_v1, &bkey);
	if (!be)
		return PICK_BACKEND_MISSING;
	*out = *be;
	*ordinal = bkey.ordinal;

	if (fe->affinity_timeout) {
		struct aff6_value a = { .ts = now, .port = be->port, .flags = be->flags, .ordinal = bkey.ordinal };
		addr6_copy(a.addr, be->addr);
		bpf_map_update_elem(&sl_aff6_v1, &akey, &a, BPF_ANY);
	}
	return PICK_OK;
}
