/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Conntrack (sl_ct_v2): a hash holding two entries per tracked flow.
 *
 *  forward entry: keyed by the flow's first packet as it arrived (client ->
 *                 frontend); says where to DNAT (and SNAT) it.
 *  reverse entry: keyed by the reply as it arrives (backend -> client, or
 *                 backend -> node IP when SNATed); says how to restore it.
 *
 * Each packet looks up its own tuple once and updates only the entry it found,
 * so the two directions never write the same cache line. Each entry names its
 * peer, so userspace judges and deletes the pair together. Nothing in the kernel
 * expires entries: the conntrack scanner does, from last_seen and tcp_seen. */
#pragma once

#include "common.h"
#include "consts.h"
#include "parse.h"

struct ct_key {
	__be32 saddr;		/* network order */
	__be32 daddr;		/* network order */
	__be16 sport;		/* network order */
	__be16 dport;		/* network order */
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad[3];		/* 0 */
};
ASSERT_SIZE(struct ct_key, 16);

enum ct_type : __u8 {
	CT_FORWARD = 1,
	CT_REVERSE = 2,
};

/* Policy verdicts recorded on both entries of a flow, one per direction of
 * policy: the source workload's egress and the destination workload's
 * ingress. */
enum pol_verdict : __u8 {
	POL_UNJUDGED = 0,	/* no policy program has seen the flow yet */
	POL_ALLOWED = 1,
	POL_DENIED = 2,
};

/* Bits of ct_value.tcp_seen above the TCP_FLAG_* bits. */
enum ct_seen : __u32 {
	/* This direction sent its FIN before the other did: this side closed
	 * first and holds the tuple in TIME_WAIT. */
	CT_SEEN_FIN_FIRST = 1 << 8,
	/* A packet matched this entry after the flow was created. On a reverse
	 * entry: the destination answered, so a non-TCP flow is assured (as
	 * netfilter's IPS_ASSURED); a scanner under pressure drops flows that
	 * were never answered first. */
	CT_SEEN_PACKET = 1 << 9,
	/* Local delivery (deliver.h) found that this direction's destination
	 * is not behind a workload interface of this node: the direction's
	 * packets from a workload go by the node's stack, and local delivery
	 * asks no more for each of them. A flow's destination does not move,
	 * so the mark holds for the entry's life (a reused tuple is a new
	 * entry); a destination that becomes a ready workload later (its
	 * interface marked ready after the flow began) only costs that flow
	 * the shortcut, never its packets. */
	CT_SEEN_STACK_ROUTED = 1 << 10,
};

enum ct_flags : __u8 {
	CT_SNAT = 1 << 0,	/* the flow's source is translated too */
	CT_FROM_HOST = 1 << 1,	/* the flow entered on a host (data) interface */
	CT_BACKEND_LOCAL = 1 << 2, /* the backend runs on this node */
	CT_HAIRPIN = 1 << 3,	/* a workload's flow to itself through its Service:
				 * both directions go straight back into it
				 * (hairpin_return) */
	CT_NODE_SOURCE = 1 << 4, /* a direction of the flow leaves a workload with
				 * the node's address as source (SNATed to the
				 * node, or replies to a node address): routed
				 * by fib_forward, not the node's stack */
	CT_DSR = 1 << 5,	/* direct server return (dsr.h). Without
				 * CT_BACKEND_LOCAL: the node that balanced the
				 * flow, which sees only its forward direction;
				 * with it: the backend's node, whose reverse
				 * entry restores the frontend as the replies'
				 * source and routes them out by the FIB */
};

struct ct_value {
	__u64 created;		/* host order: sl_now() at creation */
	__u64 last_seen;	/* host order: sl_now() of a recent packet
				 * (refreshed at most every CT_REFRESH_NS) */
	struct ct_key peer;	/* the other entry of the pair */
	__be32 nat_addr;	/* network order: forward: the backend (new
				 * destination); reverse: the frontend (new source) */
	__be32 snat_addr;	/* network order, with CT_SNAT: forward: the new
				 * source (the node IP, or the client itself when only
				 * its port is remapped); reverse: the client (new
				 * destination) */
	__be16 nat_port;	/* network order, as nat_addr */
	__be16 snat_port;	/* network order, as snat_addr */
	__u32 svc_id;		/* host order: the service the flow was balanced by */
	__u32 tcp_seen;		/* host order: TCP_FLAG_* bits seen on packets that
				 * matched this entry, and enum ct_seen marks */
	enum ct_type type;
	enum ct_flags flags;
	enum pol_verdict pol_egress;	/* the source workload's egress policy */
	enum pol_verdict pol_ingress;	/* the destination workload's ingress policy */
};
ASSERT_SIZE(struct ct_value, 56);

/* A plain hash, not an LRU: when it is full a new flow is refused (counted
 * in CNT_DROP_CT_FULL) and no established flow is ever evicted to make room,
 * as netfilter drops new connections when its table is full. The conntrack
 * scanner expires flows. v2: v1 was an LRU hash, which under a flood of new
 * flows evicted idle established connections. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_CT_MAX);
	__type(key, struct ct_key);
	__type(value, struct ct_value);
} sl_ct_v2 SEC(".maps");

/* The conntrack table a resize replaces (maps.Migration): slot 0 holds it
 * from the agent's copy of its entries until the copy of what the old
 * programs added since (Set.FinishMigrations), and is empty otherwise. The
 * hooks switch to the new programs one by one, after that first copy: a
 * packet of a flow the old programs started meanwhile finds it here
 * (ct_from_previous) rather than nowhere, where a segment of an established
 * connection would reach the node's stack and be answered with a reset. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		__uint(max_entries, 1);	/* any: an inner hash's size is its own */
		__type(key, struct ct_key);
		__type(value, struct ct_value);
	});
} sl_ctprev_v1 SEC(".maps");

/* ct_from_previous copies the pair of entries of key's flow from the table a
 * resize replaces (sl_ctprev_v1) into sl_ct_v2, and tells whether it found
 * key there. Existing entries are kept: a packet of the new programs may
 * have written one first. Only a miss of sl_ct_v2 pays for it, and only one
 * array lookup while no resize is under way. Marked unused for the bench's
 * floor programs, which include this header and never bridge. */
__subprog __attribute__((unused)) int ct_from_previous(const struct ct_key *key)
{
	__u32 slot = 0;
	void *prev = bpf_map_lookup_elem(&sl_ctprev_v1, &slot);
	struct ct_value *old, *peer;

	if (!prev)
		return 0;
	old = bpf_map_lookup_elem(prev, key);
	if (!old)
		return 0;
	/* The peer first: a packet that finds the key's entry finds its pair. */
	peer = bpf_map_lookup_elem(prev, &old->peer);
	if (peer)
		bpf_map_update_elem(&sl_ct_v2, &old->peer, peer, BPF_NOEXIST);
	bpf_map_update_elem(&sl_ct_v2, key, old, BPF_NOEXIST);
	return 1;
}

/* proto_word is a key's last 32-bit word: the protocol, then 3 bytes of 0. */
static __always_inline __u32 proto_word(__u8 proto)
{
#if __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	return proto;
#else
	return (__u32)proto << 24;
#endif
}

/* ct_key_of writes a packet's key a 32-bit word at a time, from words the
 * parser wrote whole: the map's hash reads the key in words, and a CPU
 * cannot forward a word from two smaller stores to a load (it stalls until
 * they reach its cache). */
static __always_inline void ct_key_of(const struct packet *p, struct ct_key *k)
{
	__u32 last = proto_word(p->proto);

	k->saddr = p->saddr;
	k->daddr = p->daddr;
	__builtin_memcpy(&k->sport, &p->sport, 4);
	__builtin_memcpy(&k->proto, &last, 4);
}

/* fin_first tells whether the first FIN of an entry's direction is the flow's
 * first FIN: its peer (the other direction) has sent none. It runs once per
 * direction of a flow, on the packet that brings that direction's FIN. */
__subprog enum ct_seen fin_first(struct ct_key peer)
{
	struct ct_value *o = bpf_map_lookup_elem(&sl_ct_v2, &peer);

	return o && (o->tcp_seen & TCP_FLAG_FIN) ? (enum ct_seen)0 : CT_SEEN_FIN_FIRST;
}

/* ct_lookup_reversed finds the entry keyed by a packet's reversed tuple: for
 * a packet already translated on this node, its flow's reverse entry (the
 * forward direction) or forward entry (a reply). */
static __always_inline struct ct_value *ct_lookup_reversed(const struct packet *p)
{
	struct ct_key rk = {
		.saddr = p->daddr, .daddr = p->saddr, .sport = p->dport, .dport = p->sport, .proto = p->proto,
	};
	return bpf_map_lookup_elem(&sl_ct_v2, &rk);
}

/* ct_touch records a packet on its entry: cheap enough for every packet.
 * TCP's flags, and SCTP's chunks as such (sctp_seen_flags), are kept;
 * another protocol's entry is marked as having seen a packet. */
static __always_inline void ct_touch(struct ct_value *v, const struct packet *p)
{
	__u64 now = sl_now_tick();

	if (now - v->last_seen > CT_REFRESH_NS)
		v->last_seen = now;
	if (p->proto == IPPROTO_TCP || p->proto == IPPROTO_SCTP) {
		__u32 f = p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST | TCP_FLAG_ACK);
		if ((v->tcp_seen | f) != v->tcp_seen) {
			if ((f & ~v->tcp_seen) & TCP_FLAG_FIN)
				f |= fin_first(v->peer);
			__sync_fetch_and_or(&v->tcp_seen, f);
		}
	} else if (!(v->tcp_seen & CT_SEEN_PACKET)) {
		__sync_fetch_and_or(&v->tcp_seen, CT_SEEN_PACKET);
	}
}
