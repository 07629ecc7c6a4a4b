/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Direct server return for IPv6 (dsr.h has the design).
 *
 * The carrier is a Destination Options header of 24 bytes, right after the
 * IPv6 header, holding one option (DSR6_OPT_TYPE: RFC 4727's experimental
 * type 0x1e, "skip if unknown, does not change en route") with the
 * frontend's address and port. It is only inserted into a packet that has
 * no extension headers (a header must not precede Hop-by-Hop) and that
 * still fits 1,280 bytes with it: every IPv6 link carries that much (RFC
 * 8200 5), so the option never needs a FIB lookup nor a Packet Too Big.
 * Otherwise:
 *  - a new flow's first packet that would not fit is SNATed, as without DSR
 *    (a TCP SYN always fits; a large first UDP datagram does not);
 *  - a later UDP datagram that would not fit goes without the option: the
 *    backend's node has the flow's entries from an earlier one;
 *  - a moved connection is a new flow at the node it moved to: when its first
 *    segment there would not fit (a full-size data segment), it is SNATed
 *    too, and the backend answers the SNATed tuple with a RST that ends the
 *    connection. A Packet Too Big at the link's MTU less the header, as IPv4
 *    answers (dsr.h), would keep it: not built yet.
 * The stages sit outside the IPv6 pipeline's deepest frames: dsr6_pull runs
 * from the host ingress program before pipeline6, dsr6_push from pipeline6
 * once new_flow6 has returned (NEW_FLOW_DSR). */
#pragma once

#include "common.h"
#include "conntrack6.h"
#include "counters.h"
#include "dsr.h"
#include "ipv6.h"

#define DSR6_OPT_TYPE	0x1e
#define DSR6_HDR_LEN	24
/* Every IPv6 link carries this much. */
#define DSR6_MAX_LEN	1280

struct dsr6_hdr {
	__u8 nexthdr;		/* the header that follows */
	__u8 hdrlen;		/* 2: (2 + 1) * 8 bytes */
	__u8 type;		/* DSR6_OPT_TYPE */
	__u8 len;		/* 18 */
	__u8 addr[16];		/* network order: the frontend's address */
	__be16 port;		/* network order: the frontend's port */
	__u8 pad_type;		/* 1: PadN */
	__u8 pad_len;		/* 0 */
};
ASSERT_SIZE(struct dsr6_hdr, DSR6_HDR_LEN);

struct ip_dsr6 {
	struct ip6_raw ip;
	struct dsr6_hdr opt;
};

/* NEW_FLOW_DSR: a bit new_flow6 sets on its verdict when pipeline6 must
 * insert the option (dsr6_push) before the verdict takes effect. */
#define NEW_FLOW_DSR 0x100000

/* dsr6_fits: whether a packet can carry the option (see above). */
static __always_inline int dsr6_fits(const struct packet *p)
{
	return p->l4_off == p->l3_off + IPV6_HLEN && p->ip_len + DSR6_HDR_LEN <= DSR6_MAX_LEN;
}

/* dsr6_push inserts the option naming front (the flow's tuple as it came:
 * its destination is the frontend) after the IPv6 header. */
__subprog int dsr6_push(struct __sk_buff *skb, struct packet6 *p6, const struct ct6_key *front)
{
	struct packet *p = &p6->p;
	struct ip_dsr6 h = {};

	if (!dsr6_fits(p) || bpf_skb_load_bytes(skb, p->l3_off, &h.ip, sizeof(h.ip)))
		return -1;
	if (bpf_skb_adjust_room(skb, DSR6_HDR_LEN, BPF_ADJ_ROOM_NET, 0))
		return -1;
	h.opt.nexthdr = h.ip.nexthdr;
	h.opt.hdrlen = DSR6_HDR_LEN / 8 - 1;
	h.opt.type = DSR6_OPT_TYPE;
	h.opt.len = sizeof(h.opt.addr) + sizeof(h.opt.port);
	addr6_copy(h.opt.addr, front->daddr);
	h.opt.port = front->dport;
	h.opt.pad_type = 1;
	h.ip.nexthdr = NEXTHDR_DEST;
	h.ip.payload_len = bpf_htons(bpf_ntohs(h.ip.payload_len) + DSR6_HDR_LEN);
	if (bpf_skb_store_bytes(skb, p->l3_off, &h, sizeof(h), 0))
		return -1;
	p->l4_off += DSR6_HDR_LEN;
	p->ip_len += DSR6_HDR_LEN;
	count(CNT_DSR_SENT);
	return 0;
}

/* dsr6_track: dsr_track (dsr.h) on the IPv6 maps; the entries are built in
 * the per-CPU scratch space. */
static __always_inline int dsr6_track(const struct ip_dsr6 *h, __be16 sport, __be16 dport, __u8 tcp_flags)
{
	__u32 zero = 0;
	struct ct6_scratch *s = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
	__u8 proto = h->opt.nexthdr;
	struct ct6_key fwd = { .sport = sport, .dport = dport, .proto = proto };

	if (!s)
		return -1;
	addr6_copy(fwd.saddr, h->ip.saddr);
	addr6_copy(fwd.daddr, h->ip.daddr);
	int syn = proto == IPPROTO_TCP && (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	struct ct6_value *known = bpf_map_lookup_elem(&sl_ct6_v1, &fwd);
	if (known && !syn && (known->flags & CT_DSR))
		return 0;

	__u64 now = sl_now();
	struct ct6_key *rev = &s->rev_key;
	struct ct6_value *v = &s->v;
	__builtin_memset(rev, 0, sizeof(*rev));
	__builtin_memset(v, 0, sizeof(*v));
	addr6_copy(rev->saddr, h->ip.daddr);
	addr6_copy(rev->daddr, h->ip.saddr);
	rev->sport = dport;
	rev->dport = sport;
	rev->proto = proto;
	v->created = now;
	v->last_seen = now;
	v->peer = fwd;
	addr6_copy(v->nat_addr, h->opt.addr);
	v->nat_port = h->opt.port;
	v->type = CT_REVERSE;
	v->flags = CT_DSR | CT_FROM_HOST | CT_BACKEND_LOCAL;
	v->pol_egress = POL_ALLOWED;
	int err = bpf_map_update_elem(&sl_ct6_v1, rev, v, BPF_NOEXIST);
	if (err == -E2BIG)
		return -E2BIG;
	if (err) {
		struct ct6_value *held = bpf_map_lookup_elem(&sl_ct6_v1, rev);
		if (!held || held->type != CT_REVERSE || !addr6_eq(held->peer.saddr, fwd.saddr) ||
		    !addr6_eq(held->peer.daddr, fwd.daddr) || held->peer.sport != sport || held->peer.dport != dport ||
		    bpf_map_update_elem(&sl_ct6_v1, rev, v, BPF_ANY))
			return -1;
	}
	v->peer = *rev;
	addr6_copy(v->nat_addr, h->ip.daddr);
	v->nat_port = dport;
	v->tcp_seen = tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK);
	v->type = CT_FORWARD;
	if ((err = bpf_map_update_elem(&sl_ct6_v1, &fwd, v, BPF_ANY))) {
		bpf_map_delete_elem(&sl_ct6_v1, rev);
		return err == -E2BIG ? -E2BIG : -1;
	}
	return 0;
}

/* dsr6_pull: an IPv6 packet from outside whose first extension header is a
 * Destination Options header. When it is the DSR one, it is removed and the
 * flow tracked; 0 then (or when it is not), else a drop. */
__subprog int dsr6_pull(struct __sk_buff *skb, __u32 l3_off)
{
	struct ip_dsr6 h;
	struct {
		__be16 sport, dport;
		__u8 rest[9];
		__u8 tcp_flags;	/* byte 13 of a TCP header */
	} l4;

	if (bpf_skb_load_bytes(skb, l3_off, &h, sizeof(h)) || h.ip.nexthdr != NEXTHDR_DEST ||
	    h.opt.hdrlen != DSR6_HDR_LEN / 8 - 1 || h.opt.type != DSR6_OPT_TYPE ||
	    (h.opt.nexthdr != IPPROTO_TCP && h.opt.nexthdr != IPPROTO_UDP))
		return 0;
	__u32 l4_len = h.opt.nexthdr == IPPROTO_TCP ? sizeof(l4) : 4;
	l4.tcp_flags = 0;
	if (bpf_skb_load_bytes(skb, l3_off + sizeof(h), &l4, l4_len))
		return drop(CNT_DROP_MALFORMED);
	if (bpf_skb_adjust_room(skb, -DSR6_HDR_LEN, BPF_ADJ_ROOM_NET, 0))
		return drop(CNT_DROP_DSR_FAILED);
	h.ip.nexthdr = h.opt.nexthdr;
	h.ip.payload_len = bpf_htons(bpf_ntohs(h.ip.payload_len) - DSR6_HDR_LEN);
	if (bpf_skb_store_bytes(skb, l3_off, &h.ip, 8 /* up to the addresses */, 0))
		return drop(CNT_DROP_DSR_FAILED);
	count(CNT_DSR_ACCEPTED);
	int err = dsr6_track(&h, l4.sport, l4.dport, l4.tcp_flags);
	if (err)
		return drop_create_failed(err, 0);
	return 0;
}

/* dsr6_pull_first: the cheap test every IPv6 packet from outside meets. */
static __always_inline int dsr6_pull_first(struct __sk_buff *skb, const __u32 l2_len)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	__u8 *next = data + l2_len + offsetof(struct ip6_raw, nexthdr);

	if ((void *)(next + 1) > end || *next != NEXTHDR_DEST)
		return 0;
	return dsr6_pull(skb, l2_len);
}
