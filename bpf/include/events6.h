/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow events of IPv6 service flows (events.h's ev_flow_start4 and
 * ev_flow_end4 for IPv6). */
#pragma once

#include "common.h"
#include "conntrack6.h"
#include "events.h"
#include "hook.h"
#include "ipv6.h"

/* ev_tuple6 is ev_tuple4 (events.h) for an IPv6 packet. */
static __always_inline void ev_tuple6(struct event *e, const struct packet6 *p6)
{
	e->family = 6;
	addr6_copy(e->saddr, p6->saddr);
	addr6_copy(e->daddr, p6->daddr);
	e->sport = p6->p.sport;
	e->dport = p6->p.dport;
	e->proto = p6->p.proto;
}

/* ev_flow_end6 writes an IPv6 service flow's end (ev_flow_end4). */
static __always_inline void ev_flow_end6_write(const struct __sk_buff *skb, const struct packet6 *p6, enum hook hook,
					       __u32 svc_id)
{
	struct event *e = ev_reserve(EV_FLOW_END, hook, skb->ifindex);

	if (!e)
		return;
	ev_tuple6(e, p6);
	e->svc_id = svc_id;
	e->reason = p6->p.tcp_flags;
	ev_submit(e);
}

/* ev_flow_start6 writes the start of the flow new_flow6 (or xdp_accel_new6)
 * has just created (key: its tuple as it came), from its forward entry;
 * ifindex: the interface of the hook. Called by pipeline6, outside
 * new_flow6's frame. The tuple is copied here, not by a helper shared with
 * ev_tuple6: passed through one, the addresses' copies spill, and this
 * frame grew from 24 to 96 bytes, past the verifier's bound on
 * xdp_accel_new6's chain. */
__subprog void ev_flow_start6(__u32 ifindex, const struct ct6_key *key, enum hook hook)
{
	const struct ct6_value *fwd = bpf_map_lookup_elem(&sl_ct6_v1, key);
	struct event *e;

	if (!fwd || !fwd->svc_id || !(e = ev_reserve(EV_FLOW_START, hook, ifindex)))
		return;
	e->family = 6;
	addr6_copy(e->saddr, key->saddr);
	addr6_copy(e->daddr, key->daddr);
	e->sport = key->sport;
	e->dport = key->dport;
	e->proto = key->proto;
	e->svc_id = fwd->svc_id;
	addr6_copy(e->nat_addr, fwd->nat_addr);
	e->nat_port = fwd->nat_port;
	ev_submit(e);
}

/* ev_drop6 is ev_drop4 (events.h) for an IPv6 packet. */
__subprog void ev_drop6(__u32 ifindex, enum hook hook, const struct packet6 *p6)
{
	struct event *e = ev_reserve_drop(hook, ifindex);
	if (!e)
		return;
	ev_tuple6(e, p6);
	ev_submit(e);
}

/* ev_flow_end6 is ev_flow_end4 (events.h) for an IPv6 flow. */
__subprog void ev_flow_end6(const struct __sk_buff *skb, const struct packet6 *p6, enum hook hook,
			    const struct ct6_value *v)
{
	if (!(p6->p.tcp_flags & TCP_FLAG_RST)) {
		struct ct6_value *o = bpf_map_lookup_elem(&sl_ct6_v1, &v->peer);
		if (!o || !(o->tcp_seen & TCP_FLAG_FIN))
			return;
	}
	ev_flow_end6_write(skb, p6, hook, v->svc_id);
}
