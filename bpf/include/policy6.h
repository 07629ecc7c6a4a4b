/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Policy for IPv6 flows: policy.h's hand-off, enforcement and verdict
 * records on the IPv6 conntrack entries, the flow's addresses carried in the
 * per-CPU scratch map (policy_handoff6), and the event of a denied flow of
 * either family. */
#pragma once

#include "common.h"
#include "conntrack6.h"
#include "counters.h"
#include "events.h"
#include "hook.h"
#include "ipv6.h"
#include "policy.h"

/* policy_handoff6: policy_handoff for an IPv6 packet. Its addresses go to
 * the per-CPU scratch map; cb carries the rest, with POLICY_IPV6. */
static __always_inline int policy_handoff6(struct __sk_buff *skb, const struct packet6 *p6, __u32 dir, __u32 slot)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
	const struct packet *p = &p6->p;

	if (!sc)
		return drop(CNT_DROP_POLICY_MISSING);
	addr6_copy(sc->pol.saddr, p6->saddr);
	addr6_copy(sc->pol.daddr, p6->daddr);
	skb->cb[0] = 0;
	skb->cb[1] = 0;
	skb->cb[2] = (__u32)p->sport | ((__u32)p->dport << 16);
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) |
		     (dir << POLICY_DIR_SHIFT) | POLICY_IPV6 | policy_dry_run();
	skb->cb[4] = slot;
	return JUDGE_BY_POLICY;
}

/* policy_tuple_pre_nat6 and policy_handoff_pre_nat6: policy.h's pre-NAT
 * pair (a host endpoint judges external traffic to a Service on the tuple
 * as it came) for an IPv6 packet; nothing between the two may use cb or the
 * scratch map's tuple (ct6_create leaves it alone). */
static __always_inline int policy_tuple_pre_nat6(struct __sk_buff *skb, const struct packet6 *p6)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);

	if (!sc)
		return -1;
	addr6_copy(sc->pol.saddr, p6->saddr);
	addr6_copy(sc->pol.daddr, p6->daddr);
	skb->cb[0] = 0;
	skb->cb[1] = 0;
	skb->cb[2] = (__u32)p6->p.sport | ((__u32)p6->p.dport << 16);
	return 0;
}

static __always_inline int policy_handoff_pre_nat6(struct __sk_buff *skb, const struct packet *p, __u32 dir, __u32 slot)
{
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) |
		     (dir << POLICY_DIR_SHIFT) | POLICY_PRE_NAT | POLICY_IPV6 | policy_dry_run();
	skb->cb[4] = slot;
	return JUDGE_BY_POLICY;
}

/* enforce6_judged: enforce_judged (policy.h) on an IPv6 flow's entry. */
__subprog int enforce6_judged(struct __sk_buff *skb, const struct packet6 *p6, struct ct6_value *v, __u32 dir)
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
	return policy_handoff6(skb, p6, dir, slot);
}

/* enforce6: enforce (policy.h), the allowed flow's check inline. */
static __always_inline int enforce6(struct __sk_buff *skb, const struct packet6 *p6, struct ct6_value *v, __u32 dir)
{
	if ((dir == POLICY_DIR_EGRESS ? v->pol_egress : v->pol_ingress) == POL_ALLOWED)
		return TC_ACT_OK;
	return enforce6_judged(skb, p6, v, dir);
}

/* judge_stateless6: judge_stateless (policy.h) for an IPv6 packet. */
static __always_inline int judge_stateless6(struct __sk_buff *skb, const struct packet6 *p6, __u32 dir)
{
	__u32 slot = policy_slot(skb, dir);

	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	return policy_handoff6(skb, p6, dir, slot);
}

/* ev_policy_drop writes the event of a flow a policy denied: its tuple as
 * the policy judged it (cb, and the IPv6 scratch), the rule that decided. */
__subprog void ev_policy_drop(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
	struct event *e = ev_reserve(EV_DROP, (skb->cb[3] >> POLICY_DIR_SHIFT) & 1 ? HOOK_TO_WL : HOOK_FROM_WL, skb->ifindex);

	if (!e)
		return;
	e->reason = CNT_DROP_POLICY;
	e->rule_id = skb->cb[4];
	e->proto = skb->cb[3] & 0xff;
	e->sport = skb->cb[2] & 0xffff;
	e->dport = skb->cb[2] >> 16;
	if (skb->cb[3] & POLICY_IPV6) {
		e->family = 6;
		if (sc) {
			addr6_copy(e->saddr, sc->pol.saddr);
			addr6_copy(e->daddr, sc->pol.daddr);
		}
	} else {
		e->family = 4;
		ev_addr4(e->saddr, skb->cb[0]);
		ev_addr4(e->daddr, skb->cb[1]);
	}
	ev_submit(e);
}

/* policy_record6 writes a policy's verdict on both entries of the IPv6 flow
 * whose tuple (as the destination sees it) policy_handoff6 left. */
__subprog int policy_record6(struct __sk_buff *skb, __u32 dir, enum pol_verdict verdict)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);

	if (!sc)
		return 0;
	struct ct6_key key = { .sport = skb->cb[2] >> 16, .dport = skb->cb[2] & 0xffff, .proto = skb->cb[3] & 0xff };
	struct ct6_value *rev, *fwd;
	if (skb->cb[3] & POLICY_PRE_NAT) {
		/* The tuple is the forward key itself; the reverse entry is its peer. */
		key.sport = skb->cb[2] & 0xffff;
		key.dport = skb->cb[2] >> 16;
		addr6_copy(key.saddr, sc->pol.saddr);
		addr6_copy(key.daddr, sc->pol.daddr);
		fwd = bpf_map_lookup_elem(&sl_ct6_v1, &key);
		if (!fwd)
			return 0;
		rev = bpf_map_lookup_elem(&sl_ct6_v1, &fwd->peer);
		if (!rev)
			return 0;
	} else {
		addr6_copy(key.saddr, sc->pol.daddr);
		addr6_copy(key.daddr, sc->pol.saddr);
		rev = bpf_map_lookup_elem(&sl_ct6_v1, &key);
		if (!rev)
			return 0;
		fwd = bpf_map_lookup_elem(&sl_ct6_v1, &rev->peer);
	}
	if (dir == POLICY_DIR_EGRESS) {
		rev->pol_egress = verdict;
		if (fwd)
			fwd->pol_egress = verdict;
	} else {
		rev->pol_ingress = verdict;
		if (fwd)
			fwd->pol_ingress = verdict;
	}
	return 0;
}
