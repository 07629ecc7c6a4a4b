/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-service traffic counters (sl_svcstats_v1): a per-CPU array indexed by
 * service id, so counting a packet costs one array lookup and no lock. The
 * NAT syncer keeps service ids below the array's size (it reuses the lowest
 * free id); a larger id, adopted from an older agent, is not counted.
 * Userspace sums the CPUs for the service ids it knows. */
#pragma once

#include "common.h"
#include "consts.h"
#include "parse.h"

struct svcstats_value {
	__u64 fwd_packets;	/* host order: client to service */
	__u64 fwd_bytes;	/* host order: IP length of those packets */
	__u64 rev_packets;	/* host order: replies */
	__u64 rev_bytes;	/* host order */
	__u64 new_flows;	/* host order: flows balanced to a backend */
};
ASSERT_SIZE(struct svcstats_value, 40);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, SL_SVCSTATS_MAX);
	__type(key, __u32);
	__type(value, struct svcstats_value);
} sl_svcstats_v1 SEC(".maps");

/* svcstats_count counts a packet of a service's flow: forward (to the
 * service) or a reply, and whether it starts the flow. Per-CPU: no other CPU
 * writes this slot. */
static __always_inline void svcstats_count(__u32 svc_id, const struct packet *p, int reply, int new_flow)
{
	struct svcstats_value *s = bpf_map_lookup_elem(&sl_svcstats_v1, &svc_id);

	if (!s)
		return;
	if (reply) {
		s->rev_packets += 1;
		s->rev_bytes += p->ip_len;
	} else {
		s->fwd_packets += 1;
		s->fwd_bytes += p->ip_len;
	}
	s->new_flows += new_flow;
}
