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
 *   cb[4] the slot, until the tail call; then written by the policy program:
 *         the matched rule's id
 *
 * An IPv6 flow's addresses do not fit: cb[0] and cb[1] are 0, POLICY_IPV6 is
 * set in cb[3], and the addresses are in the per-CPU scratch map
 * (policy_handoff6, datapath6.h), where the policy program and the verdict
 * program, tail-called on the same CPU, read them.
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
#include "ifstate.h"
#include "parse.h"
#include "rewrite.h"

#define POLICY_VERDICT_SLOT	0
#define POLICY_DIR_EGRESS	0	/* judged leaving a workload (sl_from_wl) */
#define POLICY_DIR_INGRESS	1	/* judged entering a workload (sl_to_wl) */
#define POLICY_DIR_SHIFT	24
#define POLICY_ALLOW		(1u << 28)
#define POLICY_DENY		(1u << 29)
/* The tuple in cb is the flow's forward key, the packet as it entered (a
 * host endpoint's ingress policy judges external traffic to a Service before
 * DNAT), rather than the tuple the destination sees. */
#define POLICY_PRE_NAT		(1u << 30)
/* The packet is a workload's to itself through its Service: once allowed it
 * is sent straight back (hairpin_return), not up the node's stack. */
#define POLICY_HAIRPIN		(1u << 31)
/* The packet leaves a workload with the node's address as source: once
 * allowed it is routed by the FIB (fib_forward), not the node's stack. */
#define POLICY_FIB_FORWARD	(1u << 25)
/* An IPv6 flow: cb[0] and cb[1] are 0, its addresses are in the per-CPU
 * scratch map (struct policy6_tuple, conntrack6.h; policy_handoff6). */
#define POLICY_IPV6		(1u << 27)
/* A dry run (sluice trace): the verdict program returns the verdict and
 * writes nothing — no conntrack verdict, no rule counter, no event. Only
 * the programs a trace loads (dry_run below) set it: the live ones write
 * cb[3] whole at each hand-off, so a live packet never carries it. */
#define POLICY_DRY_RUN		(1u << 26)

/* dry_run: 1 in the copy of the programs `sluice trace` loads (gen
 * LoadOptions.DryRun), 0 in the agent's; a load-time constant, so the
 * agent's programs carry no trace of it. */
volatile const __u32 dry_run = 0;

static __always_inline __u32 policy_dry_run(void)
{
	return dry_run ? POLICY_DRY_RUN : 0;
}

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

/* The IPv6 members of the IP sets (read by the compiled policy programs). */
struct ipset6_key {
	__u32 prefixlen;	/* host order: 32 + the member's prefix length */
	__be32 set_id;		/* network order */
	__u8 addr[16];		/* network order */
};
ASSERT_SIZE(struct ipset6_key, 24);

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_IPSET_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipset6_key);
	__type(value, struct ipset_value);
} sl_ipset6_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_IPSET_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct ipset_key);
	__type(value, struct ipset_value);
} sl_ipset_v1 SEC(".maps");

/* What a stage of the datapath returns: a TC verdict (TC_ACT_OK,
 * TC_ACT_SHOT, or bpf_redirect's TC_ACT_REDIRECT; all below 16), or
 * JUDGE_BY_POLICY: "this packet waits for a policy program's judgement",
 * whose slot and tuple are in skb->cb (policy_handoff). A stage cannot
 * tail-call the policy program itself: in a program that mixes tail calls
 * and BPF subprograms the verifier refuses a tail call once the frames above
 * it hold more than 256 bytes of stack, and the stages' frames hold more. So
 * the entry program makes the call (policy_dispatch), from its own frame. */
#define JUDGE_BY_POLICY 0x10000
/* FORWARD_BY_FIB: "this packet passes, routed by fib_forward", which the
 * entry program calls from its own frame (policy_dispatch), so that the FIB
 * lookup's stack does not add to the stages'. */
#define FORWARD_BY_FIB 0x20000
/* fib.h, included after this file (its path-MTU answers need the IPv6
 * pipeline's ICMPv6 translation, which needs this file). */
static __always_inline int forward_by_fib(struct __sk_buff *skb);

/* policy_handoff writes the packet's tuple (as the destination will see it)
 * and the policy slot into skb->cb, for policy_dispatch. The slot is kept in
 * cb[4] only until the tail call; the policy program then writes its rule id
 * there. */
static __always_inline int policy_handoff(struct __sk_buff *skb, const struct packet *p, __u32 dir, __u32 slot)
{
	skb->cb[0] = p->saddr;
	skb->cb[1] = p->daddr;
	skb->cb[2] = (__u32)p->sport | ((__u32)p->dport << 16);
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) | (dir << POLICY_DIR_SHIFT) |
		     policy_dry_run();
	skb->cb[4] = slot;
	return JUDGE_BY_POLICY;
}

/* policy_tuple_pre_nat writes a packet's tuple as it entered (its flow's
 * forward key) to cb, before the packet is translated; policy_handoff_pre_nat
 * then hands it over to be judged on that tuple. Nothing between the two may
 * use cb. */
static __always_inline void policy_tuple_pre_nat(struct __sk_buff *skb, const struct packet *p)
{
	skb->cb[0] = p->saddr;
	skb->cb[1] = p->daddr;
	skb->cb[2] = (__u32)p->sport | ((__u32)p->dport << 16);
}

static __always_inline int policy_handoff_pre_nat(struct __sk_buff *skb, const struct packet *p, __u32 dir, __u32 slot)
{
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) |
		     (dir << POLICY_DIR_SHIFT) | POLICY_PRE_NAT | policy_dry_run();
	skb->cb[4] = slot;
	return JUDGE_BY_POLICY;
}

/* hairpin_verdict finishes a stage's verdict on a hairpin packet (a
 * workload's to itself through its Service): passed, it is sent straight
 * back; waiting for its policy, it is sent back once allowed. */
static __always_inline int hairpin_verdict(struct __sk_buff *skb, int verdict)
{
	if (verdict == TC_ACT_OK)
		return hairpin_return(skb);
	if (verdict == JUDGE_BY_POLICY)
		skb->cb[3] |= POLICY_HAIRPIN;
	return verdict;
}

/* fib_verdict finishes a stage's verdict on a workload's packet whose
 * source is now the node's address: passed, it is routed by the FIB; waiting
 * for its policy, it is routed once allowed. */
static __always_inline int fib_verdict(struct __sk_buff *skb, int verdict)
{
	if (verdict == TC_ACT_OK)
		return FORWARD_BY_FIB;
	if (verdict == JUDGE_BY_POLICY)
		skb->cb[3] |= POLICY_FIB_FORWARD;
	return verdict;
}

/* policy_dispatch finishes an entry program: a TC verdict is returned as it
 * is; FORWARD_BY_FIB becomes forward_by_fib; JUDGE_BY_POLICY becomes the tail
 * call into the slot's policy program, and a slot without a program drops
 * (fail closed). */
static __always_inline int policy_dispatch(struct __sk_buff *skb, int verdict)
{
	if (verdict == FORWARD_BY_FIB)
		return forward_by_fib(skb);
	if (verdict != JUDGE_BY_POLICY)
		return verdict;
	__u32 slot = skb->cb[4];
	skb->cb[4] = 0;
	bpf_tail_call(skb, &sl_polprog_v1, slot);
	count(CNT_DROP_POLICY_MISSING);
	return TC_ACT_SHOT;
}

/* ---- Which policy judges a packet, and when ---- */

/* policy_slot returns the interface's policy slot for a direction, or
 * IFSTATE_NO_POLICY. */
static __always_inline __u32 policy_slot(struct __sk_buff *skb, __u32 dir)
{
	struct ifstate_key k = { .ifindex = skb->ifindex };
	struct ifstate_value *v = bpf_map_lookup_elem(&sl_ifstate_v1, &k);

	if (!v)
		return IFSTATE_NO_POLICY;
	return dir == POLICY_DIR_EGRESS ? v->egress_policy : v->ingress_policy;
}

/* enforce applies the verdict recorded on a flow's entry for one direction;
 * an unjudged flow goes to the interface's policy program, or is recorded as
 * allowed when the interface has none. */
__subprog int enforce_judged(struct __sk_buff *skb, const struct packet *p, struct ct_value *v, __u32 dir)
{
	enum pol_verdict pv = dir == POLICY_DIR_EGRESS ? v->pol_egress : v->pol_ingress;

	if (pv == POL_DENIED)
		return drop(CNT_DROP_POLICY);
	__u32 slot = policy_slot(skb, dir);
	if (slot == IFSTATE_NO_POLICY) {
		if (dir == POLICY_DIR_EGRESS)
			v->pol_egress = POL_ALLOWED;
		else
			v->pol_ingress = POL_ALLOWED;
		return TC_ACT_OK;
	}
	return policy_handoff(skb, p, dir, slot);
}

/* enforce: a flow's packets after its first were allowed, as a rule: that
 * check is made here, without the subprogram's call (a call and its return
 * cost tens of ns where returns go through thunks). */
static __always_inline int enforce(struct __sk_buff *skb, const struct packet *p, struct ct_value *v, __u32 dir)
{
	if ((dir == POLICY_DIR_EGRESS ? v->pol_egress : v->pol_ingress) == POL_ALLOWED)
		return TC_ACT_OK;
	return enforce_judged(skb, p, v, dir);
}

/* judge_stateless hands a packet without conntrack to the policy program, if
 * the interface has one. */
static __always_inline int judge_stateless(struct __sk_buff *skb, const struct packet *p, __u32 dir)
{
	__u32 slot = policy_slot(skb, dir);

	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	return policy_handoff(skb, p, dir, slot);
}

/* policy_record writes the verdict on both entries of the flow whose tuple
 * is in cb: the destination-side tuple, whose reversal keys the reverse entry
 * (which names the forward entry as its peer), or with POLICY_PRE_NAT the
 * forward key itself. */
static __always_inline void policy_record(struct __sk_buff *skb, __u32 dir, enum pol_verdict verdict)
{
	struct ct_key key = {
		.saddr = skb->cb[1], .daddr = skb->cb[0],
		.sport = skb->cb[2] >> 16, .dport = skb->cb[2] & 0xffff,
		.proto = skb->cb[3] & 0xff,
	};
	struct ct_value *rev, *fwd;

	if (skb->cb[3] & POLICY_PRE_NAT) {
		/* cb is the forward key itself; the reverse entry is its peer. */
		key.saddr = skb->cb[0];
		key.daddr = skb->cb[1];
		key.sport = skb->cb[2] & 0xffff;
		key.dport = skb->cb[2] >> 16;
		fwd = bpf_map_lookup_elem(&sl_ct_v2, &key);
		if (!fwd)
			return;
		struct ct_key rk = fwd->peer;
		rev = bpf_map_lookup_elem(&sl_ct_v2, &rk);
	} else {
		rev = bpf_map_lookup_elem(&sl_ct_v2, &key);
		if (!rev)
			return;
		struct ct_key fk = rev->peer;
		fwd = bpf_map_lookup_elem(&sl_ct_v2, &fk);
	}
	if (dir == POLICY_DIR_EGRESS) {
		if (rev)
			rev->pol_egress = verdict;
		if (fwd)
			fwd->pol_egress = verdict;
	} else {
		if (rev)
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

/* policy_record6 is policy_record for an IPv6 flow (datapath6.h). */
__subprog int policy_record6(struct __sk_buff *skb, __u32 dir, enum pol_verdict verdict);
/* ev_policy_drop writes a policy's drop event (datapath6.h: an IPv6 flow's
 * addresses are in the IPv6 scratch). */
__subprog void ev_policy_drop(struct __sk_buff *skb);

/* policy_verdict is the body of sl_policy_verdict (slot 0). */
static __always_inline int policy_verdict(struct __sk_buff *skb)
{
	__u32 dir = (skb->cb[3] >> POLICY_DIR_SHIFT) & 1;
	int allow = skb->cb[3] & POLICY_ALLOW;

	/* A trace reads the verdict and the rule from cb (its run's context). */
	if (skb->cb[3] & POLICY_DRY_RUN)
		return allow ? TC_ACT_OK : TC_ACT_SHOT;
	rule_count(skb->cb[4]);
	if (skb->cb[3] & POLICY_IPV6)
		policy_record6(skb, dir, allow ? POL_ALLOWED : POL_DENIED);
	else
		policy_record(skb, dir, allow ? POL_ALLOWED : POL_DENIED);
	if (allow) {
		if (skb->cb[3] & POLICY_HAIRPIN)
			return hairpin_return(skb);
		if (skb->cb[3] & POLICY_FIB_FORWARD)
			return forward_by_fib(skb);
		return TC_ACT_OK;
	}
	count(CNT_DROP_POLICY);
	ev_policy_drop(skb);
	return TC_ACT_SHOT;
}
