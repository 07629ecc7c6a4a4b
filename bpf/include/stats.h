/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-interface packet counters (sl_ifstats_v1).
 *
 * Byte order: every field is host byte order. */
#pragma once

#include "common.h"
#include "consts.h"

struct if_stats_key {
	__u32 ifindex;		/* host order: the interface the program runs on */
};
ASSERT_SIZE(struct if_stats_key, 4);

struct if_stats {
	__u64 packets;		/* host order: every packet seen */
	__u64 bytes;		/* host order: skb->len summed */
	__u64 ipv4;		/* host order: well-formed IPv4 packets */
	__u64 tcp;		/* host order: IPv4 packets with a whole TCP header */
	__u64 udp;		/* host order: IPv4 packets with a whole UDP header */
	__u64 non_ipv4;		/* host order: anything that is not IPv4 (passed untouched) */
	__u64 malformed;	/* host order: truncated or inconsistent headers */
};
ASSERT_SIZE(struct if_stats, 56);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_IFSTATS_MAX);
	__type(key, struct if_stats_key);
	__type(value, struct if_stats);
} sl_ifstats_v1 SEC(".maps");

static __always_inline struct if_stats *if_stats_get(__u32 ifindex)
{
	struct if_stats_key key = { .ifindex = ifindex };
	struct if_stats *st = bpf_map_lookup_elem(&sl_ifstats_v1, &key);

	if (st)
		return st;
	struct if_stats zero = {};
	/* NOEXIST: two CPUs racing to create the entry must not reset each other's counts. */
	bpf_map_update_elem(&sl_ifstats_v1, &key, &zero, BPF_NOEXIST);
	return bpf_map_lookup_elem(&sl_ifstats_v1, &key);
}
