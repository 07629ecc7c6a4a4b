/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow events: drops, and (with CFG_FLOW_EVENTS) service flows starting and
 * ending, written to a ring buffer (sl_events_v1) that `sluice monitor`
 * reads.
 *
 * A flood must not hurt the datapath: each CPU writes at most
 * config.events_per_sec events a second (0 turns events off) and counts the
 * rest (CNT_EVENTS_SUPPRESSED); a ring buffer that nobody reads fills and
 * refuses (CNT_EVENTS_LOST), which costs a failed reservation. An event is
 * written in place in the ring buffer (reserve, fill, submit): no stack; its
 * reader is woken only once 64 KiB wait (ev_submit), and polls meanwhile.
 *
 * Where events come from:
 *  - a drop: every drop() notes its reason on the CPU (sl_evcpu_v1,
 *    counters.h); the
 *    entry program, seeing TC_ACT_SHOT, writes the event with the packet's
 *    addresses as they were when dropped. A policy's drop is written by the
 *    verdict program, with the rule.
 *  - a flow start: new_flow, once its entries are written, with the backend.
 *  - a flow end: the packet that closes a service flow (the second
 *    direction's first FIN, or a RST). A UDP flow ends by expiring, which the
 *    conntrack scanner does (sluice_conntrack_deleted_total). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "counters.h"
#include "hook.h"
#include "parse.h"
#include "service.h"

enum event_type : __u8 {
	EV_DROP = 1,
	EV_FLOW_START = 2,
	EV_FLOW_END = 3,
};

struct event {
	__u64 ts;		/* host order: sl_now() */
	__u8 saddr[16];		/* network order; IPv4 as ::ffff:a.b.c.d */
	__u8 daddr[16];		/* network order */
	__u8 nat_addr[16];	/* network order: EV_FLOW_START: the backend */
	__be16 sport;		/* network order */
	__be16 dport;		/* network order */
	__be16 nat_port;	/* network order: EV_FLOW_START: the backend's */
	__u8 proto;		/* IPPROTO_* */
	enum event_type type;
	__u32 reason;		/* host order: EV_DROP: the enum counter; EV_FLOW_END:
				 * the TCP flags that ended it */
	__u32 svc_id;		/* host order: the service id, where known */
	__u32 rule_id;		/* host order: a policy's drop: the rule */
	__u32 ifindex;		/* host order: the interface of the hook */
	__u8 hook;		/* enum hook */
	__u8 family;		/* 4 or 6 */
	__u8 pad[6];		/* 0 */
};
ASSERT_SIZE(struct event, 88);

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);	/* 1 MiB: about 10,000 events */
} sl_events_v1 SEC(".maps");

/* ev_reserve returns a zeroed event of type from the ring buffer, or NULL
 * when events are off, this CPU's budget is spent, or the buffer is full. */
static __always_inline struct event *ev_reserve(enum event_type type, enum hook hook, __u32 ifindex)
{
	struct config *cfg = config_get();
	struct ev_cpu *st = ev_cpu_get();

	if (!cfg || !cfg->events_per_sec || !st)
		return NULL;
	__u64 now = sl_now();
	if (now - st->window >= 1000000000ULL) {
		st->window = now;
		st->used = 0;
	}
	if (st->used >= cfg->events_per_sec) {
		count(CNT_EVENTS_SUPPRESSED);
		return NULL;
	}
	struct event *e = bpf_ringbuf_reserve(&sl_events_v1, sizeof(*e), 0);
	if (!e) {
		count(CNT_EVENTS_LOST);
		return NULL;
	}
	st->used++;
	__builtin_memset(e, 0, sizeof(*e));
	e->ts = now;
	e->type = type;
	e->hook = hook;
	e->ifindex = ifindex;
	return e;
}

/* The reader is woken once this much is waiting, not for each event: a
 * wakeup per event would cost each event microseconds. The reader polls
 * meanwhile (maps.EventReader: every EventPoll). */
#define EV_WAKEUP_BYTES (64 << 10)

/* ev_submit hands a filled event to its reader. A subprogram so that struct
 * event is in the object's BTF, for its generated Go twin. */
__subprog void ev_submit(struct event *e)
{
	__u64 waiting = bpf_ringbuf_query(&sl_events_v1, BPF_RB_AVAIL_DATA);

	bpf_ringbuf_submit(e, waiting >= EV_WAKEUP_BYTES ? BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
}

/* ev_addr4 writes an IPv4 address as IPv4-mapped IPv6. */
static __always_inline void ev_addr4(__u8 *dst, __be32 a)
{
	dst[10] = 0xff;
	dst[11] = 0xff;
	__builtin_memcpy(dst + 12, &a, 4);
}

/* ev_flow_events: whether flow starts and ends are written. */
static __always_inline int ev_flow_events(void)
{
	struct config *cfg = config_get();

	return cfg && cfg->events_per_sec && (cfg->flags & CFG_FLOW_EVENTS);
}

/* ev_reserve_drop returns a drop event (ev_reserve) with the reason drop()
 * noted on this CPU, or NULL. */
static __always_inline struct event *ev_reserve_drop(enum hook hook, __u32 ifindex)
{
	struct ev_cpu *st = ev_cpu_get();
	struct event *e;

	if (!st || !(e = ev_reserve(EV_DROP, hook, ifindex)))
		return NULL;
	e->reason = st->last_drop;
	return e;
}

/* ev_tuple4 writes an IPv4 packet's addresses, ports and protocol. */
static __always_inline void ev_tuple4(struct event *e, const struct packet *p)
{
	e->family = 4;
	ev_addr4(e->saddr, p->saddr);
	ev_addr4(e->daddr, p->daddr);
	e->sport = p->sport;
	e->dport = p->dport;
	e->proto = p->proto;
}

/* ev_drop writes the event of a packet an entry program drops: the reason
 * drop() noted, the addresses and ports read from the packet. */
__subprog void ev_drop(struct __sk_buff *skb, enum hook hook, __u32 l2_len)
{
	struct event *e = ev_reserve_drop(hook, skb->ifindex);
	if (!e)
		return;
	__u32 l4_off = 0;
	if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct {
			__be32 ver_tc_flow;
			__be16 payload_len;
			__u8 nexthdr, hop_limit;
		} h6;
		e->family = 6;
		if (!bpf_skb_load_bytes(skb, l2_len, &h6, sizeof(h6)) &&
		    !bpf_skb_load_bytes(skb, l2_len + 8, e->saddr, 32)) {
			e->proto = h6.nexthdr;
			l4_off = l2_len + 40;
		}
	} else {
		struct iphdr ip;
		e->family = 4;
		if (!bpf_skb_load_bytes(skb, l2_len, &ip, sizeof(ip))) {
			ev_addr4(e->saddr, ip.saddr);
			ev_addr4(e->daddr, ip.daddr);
			e->proto = ip.protocol;
			if (!(ip.frag_off & bpf_htons(0x1fff)))
				l4_off = l2_len + ip.ihl * 4;
		}
	}
	if (l4_off && has_ports(e->proto)) {
		__be16 ports[2];
		if (!bpf_skb_load_bytes(skb, l4_off, ports, sizeof(ports))) {
			e->sport = ports[0];
			e->dport = ports[1];
		}
	}
	ev_submit(e);
}

/* ev_drop4 writes the event of an IPv4 packet dropped before an skb exists
 * (XDP): the reason drop() noted, p's addresses and ports. */
__subprog void ev_drop4(__u32 ifindex, enum hook hook, const struct packet *p)
{
	struct event *e = ev_reserve_drop(hook, ifindex);
	if (!e)
		return;
	ev_tuple4(e, p);
	ev_submit(e);
}

/* ev_flow4 writes an IPv4 service flow's start (be: its backend) or, be
 * NULL, its end; ifindex: the interface of the hook. */
__subprog void ev_flow4(__u32 ifindex, const struct packet *p, enum hook hook, __u32 svc_id,
			const struct be_value *be)
{
	struct event *e = ev_reserve(be ? EV_FLOW_START : EV_FLOW_END, hook, ifindex);

	if (!e)
		return;
	ev_tuple4(e, p);
	e->svc_id = svc_id;
	if (be) {
		ev_addr4(e->nat_addr, be->addr);
		e->nat_port = be->port;
	} else {
		e->reason = p->tcp_flags;
	}
	ev_submit(e);
}

/* ev_flow_end4: a packet that is its direction's first FIN or RST of a
 * service flow (v: its entry). It closes the flow when it is a RST, or a FIN
 * after the other direction's: that is the flow's end event. */
__subprog void ev_flow_end4(const struct __sk_buff *skb, const struct packet *p, enum hook hook,
			    const struct ct_value *v)
{
	if (!(p->tcp_flags & TCP_FLAG_RST)) {
		struct ct_key peer = v->peer;
		struct ct_value *o = bpf_map_lookup_elem(&sl_ct_v2, &peer);
		if (!o || !(o->tcp_seen & TCP_FLAG_FIN))
			return;
	}
	ev_flow4(skb->ifindex, p, hook, v->svc_id, NULL);
}
