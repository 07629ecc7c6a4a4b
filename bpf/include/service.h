/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Service maps: frontends, backends, source ranges and session affinity, and the
 * service lookup and backend choice that use them.
 *
 * Frontends are a hash keyed by the exact destination, so the lookup costs the
 * same however many Services exist. Only frontends with loadBalancerSourceRanges
 * pay a second lookup, in an LPM trie keyed by (service id, source address).
 *
 * Consistency rule for writers (the NAT syncer): a frontend's backends
 * (svc_id, 0 .. count-1) are all written before the frontend points at them,
 * and deleted only after it no longer does. A frontend whose backend is missing
 * drops the packet and counts CNT_DROP_BACKEND_MISSING. */
#pragma once

#include "common.h"
#include "consts.h"
#include "maglev.h"

/* NodePort entries are also programmed at this address; a packet to any address
 * of this node (sl_hostip_v1) that matches no exact entry is looked up again
 * with it. */
#define FE_WILDCARD_ADDR	0xffffffff

struct fe_key {
	__be32 addr;		/* network order: service IP, or FE_WILDCARD_ADDR */
	__be16 port;		/* network order; 0 with proto ICMP marks a service IP
				 * whose echo requests are answered */
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP / IPPROTO_ICMP */
	__u8 pad;		/* 0 */
};
ASSERT_SIZE(struct fe_key, 8);

enum fe_flags : __u32 {
	FE_INT_LOCAL = 1 << 0,	/* internalTrafficPolicy Local: local backends only */
	FE_EXT_LOCAL = 1 << 1,	/* externalTrafficPolicy Local: traffic arriving on a
				 * host interface goes to local backends only */
	FE_SRC_RANGES = 1 << 2,	/* sources must match sl_srcrange_v1 for svc_id */
	FE_EXTERNAL = 1 << 3,	/* NodePort, LoadBalancer IP or externalIP: traffic
				 * from outside to a remote backend is SNATed */
	FE_MAGLEV = 1 << 4,	/* new flows pick from the cluster backends by the
				 * service id's Maglev table (maglev.h), so every
				 * node picks the same backend for a flow */
};

/* A service's backends are laid out as [local only][local and cluster][cluster
 * only], so both sets are contiguous: local backends are ordinals
 * 0 .. local_count-1, cluster backends cluster_start .. cluster_start+count-1.
 * Usually all local backends are cluster backends and cluster_start is 0; they
 * differ when topology hints exclude a local endpoint, or when local traffic
 * falls back to terminating endpoints while the cluster has ready ones. */
struct fe_value {
	__u32 svc_id;		/* host order: backends are (svc_id, ordinal) */
	__u32 count;		/* host order: cluster backends; 0 means the service
				 * has no usable endpoint anywhere: reject */
	__u32 local_count;	/* host order: backends on this node */
	__u32 affinity_timeout;	/* host order: seconds; 0 disables session affinity */
	enum fe_flags flags;	/* host order */
	__u32 cluster_start;	/* host order: ordinal of the first cluster backend */
};
ASSERT_SIZE(struct fe_value, 24);

struct be_key {
	__u32 svc_id;		/* host order */
	__u32 ordinal;		/* host order: 0 .. count-1 */
};
ASSERT_SIZE(struct be_key, 8);

enum be_flags : __u8 {
	BE_LOCAL = 1 << 0,	/* the backend runs on this node */
};

struct be_value {
	__be32 addr;		/* network order */
	__be16 port;		/* network order */
	enum be_flags flags;
	__u8 pad;		/* 0 */
};
ASSERT_SIZE(struct be_value, 8);

struct srcrange_key {
	__u32 prefixlen;	/* host order: 32 + CIDR bits (LPM trie prefix) */
	__be32 svc_id;		/* network order, so the trie compares it first */
	__be32 src;		/* network order: the CIDR's address */
};
ASSERT_SIZE(struct srcrange_key, 12);

struct srcrange_value {
	__u32 flags;		/* host order: reserved, 0 */
};
ASSERT_SIZE(struct srcrange_value, 4);

struct aff_key {
	__u32 svc_id;		/* host order */
	__be32 client;		/* network order: the client's source address */
};
ASSERT_SIZE(struct aff_key, 8);

struct aff_value {
	__u64 ts;		/* host order: sl_now() of the client's last
				 * new flow to the service */
	__be32 addr;		/* network order: the chosen backend */
	__be16 port;		/* network order */
	enum be_flags flags;	/* of the backend */
	__u8 pad;		/* 0 */
	__u32 ordinal;		/* host order: the backend's ordinal when chosen */
	__u32 pad2;		/* 0 */
};
ASSERT_SIZE(struct aff_value, 24);

/* Service names for people (sl_svcname_v1): written by the NAT syncer next to
 * the backends of each service id, so inspection tools can name services from
 * the pins alone. Never read by the datapath. */
#define SVCNAME_LEN 120

struct svcname_key {
	__u32 svc_id;		/* host order */
};
ASSERT_SIZE(struct svcname_key, 4);

struct svcname_value {
	char name[SVCNAME_LEN];	/* "namespace/name:port", NUL-padded; a remote-node
				 * NodePort set adds " @<node IP>" */
};
ASSERT_SIZE(struct svcname_value, 120);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_FE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct svcname_key);
	__type(value, struct svcname_value);
} sl_svcname_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_FE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);	/* memory follows the services programmed */
	__type(key, struct fe_key);
	__type(value, struct fe_value);
} sl_fe_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_BE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct be_key);
	__type(value, struct be_value);
} sl_be_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_SRCRANGE_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct srcrange_key);
	__type(value, struct srcrange_value);
} sl_srcrange_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_AFF_MAX);
	__type(key, struct aff_key);
	__type(value, struct aff_value);
} sl_aff_v1 SEC(".maps");

static __always_inline struct fe_value *fe_lookup(__be32 addr, __be16 port, __u8 proto)
{
	struct fe_key key = { .addr = addr, .port = port, .proto = proto };
	struct fe_value *fe = bpf_map_lookup_elem(&sl_fe_v1, &key);

	if (fe || !is_host_ip(addr))
		return fe;
	key.addr = FE_WILDCARD_ADDR;
	return bpf_map_lookup_elem(&sl_fe_v1, &key);
}

static __always_inline int src_allowed(const struct fe_value *fe, __be32 src)
{
	struct srcrange_key key = {
		.prefixlen = 64,	/* the whole key: 32 bits of svc_id, 32 of src */
		.svc_id = bpf_htonl(fe->svc_id),
		.src = src,
	};

	if (!(fe->flags & FE_SRC_RANGES))
		return 1;
	return bpf_map_lookup_elem(&sl_srcrange_v1, &key) != NULL;
}

enum pick_result {
	PICK_OK = 0,
	PICK_NO_ENDPOINTS,	/* reject: the service has no usable endpoint */
	PICK_NO_LOCAL,		/* drop: local only and none is local */
	PICK_BACKEND_MISSING,	/* drop: the frontend points at a missing backend */
};

/* pick_backend chooses a backend for a new flow from client, and its ordinal.
 * sport is the flow's source port, for a Maglev frontend's flow hash; a
 * socket's connect() has none yet (by_flow 0) and picks at random. */
static __always_inline int pick_backend(const struct fe_value *fe, __be32 client, __be16 sport, int by_flow,
					int local_only, struct be_value *out, __u32 *ordinal)
{
	__u32 n = local_only ? fe->local_count : fe->count;
	struct aff_key akey = { .svc_id = fe->svc_id, .client = client };
	__u64 now = sl_now();

	if (fe->count == 0)
		return PICK_NO_ENDPOINTS;
	if (n == 0)
		return PICK_NO_LOCAL;

	if (fe->affinity_timeout) {
		struct aff_value *a = bpf_map_lookup_elem(&sl_aff_v1, &akey);
		if (a && now - a->ts < (__u64)fe->affinity_timeout * NS_PER_SEC &&
		    (!local_only || (a->flags & BE_LOCAL))) {
			/* The timeout counts from the client's last new flow, as
			 * kube-proxy's (iptables recent --set, nftables update
			 * @affinity): a client that keeps coming back keeps its
			 * backend. */
			a->ts = now;
			out->addr = a->addr;
			out->port = a->port;
			out->flags = a->flags;
			*ordinal = a->ordinal;
			return PICK_OK;
		}
	}

	__u32 first = local_only ? 0 : fe->cluster_start;
	struct be_key bkey = { .svc_id = fe->svc_id, .ordinal = first + bpf_get_prandom_u32() % n };
	if (by_flow && (fe->flags & FE_MAGLEV) && !local_only)
		maglev_pick(fe->svc_id, maglev_hash4(client, sport), first, n, &bkey.ordinal);
	struct be_value *be = bpf_map_lookup_elem(&sl_be_v1, &bkey);
	if (!be)
		return PICK_BACKEND_MISSING;
	*out = *be;
	*ordinal = bkey.ordinal;

	if (fe->affinity_timeout) {
		struct aff_value a = { .ts = now, .addr = be->addr, .port = be->port, .flags = be->flags,
				       .ordinal = bkey.ordinal };
		bpf_map_update_elem(&sl_aff_v1, &akey, &a, BPF_ANY);
	}
	return PICK_OK;
}
