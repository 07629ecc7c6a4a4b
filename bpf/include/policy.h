/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Policy: the hand-off between the datapath and the policy programs the
 * policy module compiles at run time.
 *
 * For a new flow on an interface with a policy slot (sl_ifstate_v1), the
 * datapath writes the flow's tuple, as the destination will see it (after
 * DNAT and SNAT), into skb->cb and tail-calls sl_polprog_v1[slot]:
 *
 *   cb[0] source address (network order)    cb[1] destination address (network order)
 *   cb[2] source port | destination port << 16 (each network order)
 *   cb[3] protocol | ICMP type << 8 | ICMP code << 16 | direction << 24
 *   cb[4] written by the policy program: the matched rule's id
 *
 * The policy program ORs its verdict (POLICY_ALLOW / POLICY_DENY) into cb[3]
 * and tail-calls slot 0, sl_policy_verdict, which records the verdict on both
 * conntrack entries of the flow, counts the rule, and passes or drops the
 * packet. Later packets of the flow read the recorded verdict: established
 * flows are never judged again, and replies of allowed flows pass. */
#pragma once

#include "common.h"
#include "consts.h"
#include "conntrack.h"
#include "counters.h"
#include "parse.h"

#define POLICY_VERDICT_SLOT	0
#define POLICY_DIR_EGRESS	0	/* judged leaving a workload (sl_from_wl) */
#define POLICY_DIR_INGRESS	1	/* judged entering a workload (sl_to_wl) */
#define POLICY_DIR_SHIFT	24
#define POLICY_ALLOW		(1u << 28)
#define POLICY_DENY		(1u << 29)

struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, SL_POLPROG_MAX);
	__type(key, __u32);
	__type(value, __u32);
} sl_polprog_v1 SEC(".maps");

struct rulectr_key {
	__u64 rule_id;		/* host order */
};
ASSERT_SIZE(struct rulectr_key, 8);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, SL_RULECTR_MAX);
	__type(key, struct rulectr_key);
	__type(value, __u64);
} sl_rulectr_v1 SEC(".maps");

struct ipset_key {
	__u32 prefixlen;	/* host order: 32 + the member's prefix length */
	__be32 set_id;		/* network order, so the trie compares it first */
	__be32 addr;		/* network order */
};
ASSERT_SIZE(struct ipset_key, 12);

struct ipset_value {
	__u32 flags;		/* host order: reserved, 0 */
};
ASSERT_SIZE(struct ipset_value, 4);

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_IPSET_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipset_key);
	__type(value, struct ipset_value);
} sl_ipset_v1 SEC(".maps");

/* The kernel refuses tail calls from BPF subprograms with large callers, so a
 * stage that wants a policy judgement fills cb and returns POLICY_HANDOFF +
 * slot; the entry program then tail-calls (policy_dispatch). */
#define POLICY_HANDOFF 0x10000

static __always_inline int policy_handoff(struct __sk_buff *skb, const struct packet *p, __u32 dir, __u32 slot)
{
	skb->cb[0] = p->saddr;
	skb->cb[1] = p->daddr;
	skb->cb[2] = (__u32)p->sport | ((__u32)p->dport << 16);
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) | (dir << POLICY_DIR_SHIFT);
	skb->cb[4] = 0;
	return POLICY_HANDOFF + (int)(slot & 0x3fff);
}

/* policy_dispatch finishes an entry program: a hand-off becomes a tail call
 * into the policy program; a missing program drops (fail closed). */
static __always_inline int policy_dispatch(struct __sk_buff *skb, int verdict)
{
	if (verdict < POLICY_HANDOFF)
		return verdict;
	bpf_tail_call(skb, &sl_polprog_v1, verdict - POLICY_HANDOFF);
	count(CNT_DROP_POLICY_MISSING);
	return TC_ACT_SHOT;
}

/* policy_record writes the verdict on both entries of the flow whose
 * destination-side tuple is in cb: its reverse entry is keyed by the reversed
 * tuple, and names the forward entry as its peer. */
static __always_inline void policy_record(struct __sk_buff *skb, __u32 dir, enum pol_verdict verdict)
{
	struct ct_key rk = {
		.saddr = skb->cb[1], .daddr = skb->cb[0],
		.sport = skb->cb[2] >> 16, .dport = skb->cb[2] & 0xffff,
		.proto = skb->cb[3] & 0xff,
	};
	struct ct_value *rev = bpf_map_lookup_elem(&sl_ct_v2, &rk);

	if (!rev)
		return;
	struct ct_key fk = rev->peer;
	struct ct_value *fwd = bpf_map_lookup_elem(&sl_ct_v2, &fk);
	if (dir == POLICY_DIR_EGRESS) {
		rev->pol_egress = verdict;
		if (fwd)
			fwd->pol_egress = verdict;
	} else {
		rev->pol_ingress = verdict;
		if (fwd)
			fwd->pol_ingress = verdict;
	}
}

static __always_inline void rule_count(__u64 rule_id)
{
	struct rulectr_key key = { .rule_id = rule_id };
	__u64 *n = bpf_map_lookup_elem(&sl_rulectr_v1, &key);

	if (n) {
		*n += 1;	/* per-CPU */
		return;
	}
	__u64 one = 1;
	bpf_map_update_elem(&sl_rulectr_v1, &key, &one, BPF_NOEXIST);
}

/* policy_verdict is the body of sl_policy_verdict (slot 0). */
static __always_inline int policy_verdict(struct __sk_buff *skb)
{
	__u32 dir = (skb->cb[3] >> POLICY_DIR_SHIFT) & 1;
	int allow = skb->cb[3] & POLICY_ALLOW;

	rule_count(skb->cb[4]);
	policy_record(skb, dir, allow ? POL_ALLOWED : POL_DENIED);
	if (allow)
		return TC_ACT_OK;
	count(CNT_DROP_POLICY);
	return TC_ACT_SHOT;
}
