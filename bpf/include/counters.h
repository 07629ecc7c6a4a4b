/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Per-CPU counters of drops, rejects and other notable verdicts (sl_counters_v7;
 * the version grows with the array, so an older agent's pin is never opened
 * with a size it does not have):
 * a per-CPU array indexed by enum counter, each value a host-order __u64. */
#pragma once

#include "common.h"

enum counter : __u32 {
	CNT_DROP_MALFORMED = 0,		/* truncated or inconsistent IPv4/L4 headers */
	CNT_DROP_SRC_RANGE,		/* source outside loadBalancerSourceRanges */
	CNT_DROP_NO_LOCAL_BACKEND,	/* traffic policy Local and no local backend */
	CNT_DROP_BACKEND_MISSING,	/* frontend found, backend entry missing */
	CNT_DROP_SNAT_PORTS,		/* no free SNAT source port */
	CNT_DROP_CT_CREATE,		/* conntrack entry could not be written */
	CNT_DROP_REJECT_FAILED,		/* a reply (RST / ICMP) could not be built */
	CNT_REJECT_NO_ENDPOINTS,	/* TCP RST or ICMP port unreachable sent */
	CNT_PASS_FRAGMENT,		/* IPv4 non-first fragment of an unknown datagram,
					 * not to a service IP: passed untouched */
	CNT_ICMP_ECHO_ANSWERED,		/* echo request to a service IP answered */
	CNT_ICMP_ERROR_TRANSLATED,	/* ICMP error about a NATed flow reverse-translated */
	CNT_SOCK_REJECT_NO_ENDPOINTS,	/* connect()/sendmsg() refused: no endpoints */
	CNT_SOCK_NO_LOCAL_BACKEND,	/* connect()/sendmsg() failed: local only, none local */
	CNT_SOCK_STALE_BACKEND,		/* a UDP send failed: its backend left the service */
	CNT_XDP_DROP_DENIED,		/* prefilter: source in the deny list */
	CNT_XDP_PASS_FAILSAFE,		/* prefilter: denied source, failsafe port */
	CNT_DROP_POLICY,		/* a policy denied the flow */
	CNT_DROP_POLICY_MISSING,	/* the interface's policy program is not loaded */
	CNT_FRAGMENT_TRANSLATED,	/* non-first fragment matched to its flow by its
					 * first fragment's ports */
	CNT_DROP_FRAGMENT_UNKNOWN,	/* non-first fragment to a service IP whose first
					 * fragment was not seen (out of order, expired) */
	CNT_TUPLE_REMAPPED,		/* a new flow's tuple at the destination was held
					 * by another flow: its source port was remapped */
	CNT_TUPLE_REUSED,		/* a SYN reopened a closed flow's tuple: the old
					 * flow was forgotten and the SYN balanced anew */
	CNT_DROP_CT_FULL,		/* a new flow refused: the conntrack map is full */
	CNT_FLOW_NOW_SERVICE,		/* a flow tracked untranslated before its
					 * destination became a frontend is balanced anew */
	CNT_HAIRPIN_RETURNED,		/* a packet of a workload's flow to itself
					 * through its Service sent straight back */
	CNT_FIB_FORWARDED,		/* a workload's packet whose source became the
					 * node's address routed by the FIB, not the stack */
	CNT_DSR_SENT,			/* a flow's packet sent to a remote backend with
					 * the frontend in its DSR option */
	CNT_DSR_ACCEPTED,		/* a packet with a DSR option reached its
					 * backend's node: the option removed, the flow
					 * tracked for its direct replies */
	CNT_DSR_TOO_BIG,		/* a packet too big for its DSR option: the
					 * client told the smaller path MTU */
	CNT_DROP_DSR_FAILED,		/* a DSR option could not be added or removed,
					 * or its flow's entries not written */
	CNT_EVENTS_SUPPRESSED,		/* a flow event not written: its CPU's budget
					 * for the second was spent (events.h) */
	CNT_EVENTS_LOST,		/* a flow event not written: the ring buffer was
					 * full (nobody reading it, or too slowly) */
	CNT_LOCAL_DELIVERED,		/* a workload's packet handed to another
					 * workload's interface on this node, past the
					 * node's stack (deliver.h) */
	CNT_SNAT_PORT_DRAWN,		/* a flow whose source is translated could not
					 * keep the client's port (another flow holds
					 * it at the backend) and drew one from the
					 * range: the rate to alert on before
					 * CNT_DROP_SNAT_PORTS */
	CNT_REJECT_UNDEFINED_PORT,	/* a new flow to a port of a ClusterIP that no
					 * Service defines: RST or ICMP port
					 * unreachable sent (svcnet.h) */
	CNT_DROP_UNALLOCATED_SERVICE_IP, /* a new flow to an address of a
					 * ServiceCIDR that no Service holds */
	CNT_SOCK_REJECT_UNDEFINED_PORT,	/* connect()/sendmsg() to a port of a
					 * ClusterIP that no Service defines refused */
	CNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, enum counter);
	__type(value, __u64);
} sl_counters_v7 SEC(".maps");

static __always_inline void count(enum counter c)
{
	enum counter key = c;
	__u64 *v = bpf_map_lookup_elem(&sl_counters_v7, &key);

	if (v)
		*v += 1;	/* per-CPU: no other CPU writes this slot */
}

/* Each CPU's flow-event budget (events.h) and the reason of its last drop,
 * which the entry program's drop event reports. */
struct ev_cpu {
	__u64 window;		/* host order: start of the current second */
	__u32 used;		/* host order: events written in it */
	__u32 last_drop;	/* host order: the enum counter drop() last counted */
};
ASSERT_SIZE(struct ev_cpu, 16);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ev_cpu);
} sl_evcpu_v1 SEC(".maps");

static __always_inline struct ev_cpu *ev_cpu_get(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_evcpu_v1, &zero);
}

/* drop counts why a packet is dropped, notes it for the drop's event, and
 * drops it. */
static __always_inline int drop(enum counter c)
{
	struct ev_cpu *st = ev_cpu_get();

	count(c);
	if (st)
		st->last_drop = c;
	return TC_ACT_SHOT;
}

/* drop_create_failed drops a new flow whose conntrack entries could not be
 * written, counted by why: a full map, or (snat set) no free SNAT port. */
static __always_inline int drop_create_failed(int err, int snat)
{
	if (err == -E2BIG)
		return drop(CNT_DROP_CT_FULL);
	return drop(snat ? CNT_DROP_SNAT_PORTS : CNT_DROP_CT_CREATE);
}
