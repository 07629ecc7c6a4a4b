/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Flow creation and the clash rules: when a packet that matched an entry
 * starts a new flow instead (superseded), and how a new flow's pair of
 * entries is written without ever taking another flow's tuple (ct_create).
 * The conntrack layout itself is in conntrack.h. */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "consts.h"
#include "counters.h"
#include "parse.h"
#include "service.h"

/* port_claim is a search for a free reverse tuple: the reverse entry to
 * insert, whose key's dport is the port tried, and the range ports are drawn
 * from. It is the context of claim_port, so the entry lives in it. */
struct port_claim {
	struct ct_key key;
	struct ct_value val;
	__u32 lo, span;		/* host order: ports lo .. lo + span - 1 */
	__u32 tries;		/* how many the search gets (port_tries) */
	int err;		/* the last insertion's: 0 once claimed */
	__u32 zero;		/* 0: a key for per-CPU arrays (port_tries) */
};

/* port_range sets the range a flow whose source is translated draws ports
 * from: the SNAT range for the node's address (cfg may be NULL: no
 * configuration written yet, the default range), the remap range for a
 * client that keeps its own address. */
static __always_inline void port_range(const struct config *cfg, int remap, __u32 *lo, __u32 *span)
{
	__u32 l = remap ? REMAP_PORT_MIN : cfg && cfg->snat_port_min ? cfg->snat_port_min : SNAT_PORT_MIN_DEFAULT;
	__u32 h = remap ? REMAP_PORT_MAX : cfg && cfg->snat_port_max ? cfg->snat_port_max : SNAT_PORT_MAX_DEFAULT;

	*lo = l;
	*span = h < l ? 1 : h - l + 1;
}

/* A CPU's last port search that found no free port (port_tries). */
struct port_crowded {
	__u64 refused_at;	/* host order: sl_now() of that search; 0: none since one succeeded */
};
ASSERT_SIZE(struct port_crowded, 8);

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct port_crowded);
} sl_portcrowd_v1 SEC(".maps");

/* port_tries is how many ports a search on this CPU tries: PORT_TRIES, or
 * PORT_TRIES_CROWDED within PORT_CROWDED_NS of a search that found none.
 * zero points to a 0 key where the caller has one: a key on this frame
 * would deepen the callbacks' frames, which end the datapath's deepest call
 * chains. */
static __always_inline __u32 port_tries(const __u32 *zero)
{
	struct port_crowded *pc = bpf_map_lookup_elem(&sl_portcrowd_v1, zero);

	return pc && pc->refused_at && sl_now() - pc->refused_at < PORT_CROWDED_NS ? PORT_TRIES_CROWDED : PORT_TRIES;
}

/* port_search_done records a search's outcome for port_tries: err is the
 * last insertion's (-EEXIST: every port tried was taken). zero: port_tries'. */
static __always_inline void port_search_done(const __u32 *zero, int err)
{
	struct port_crowded *pc = bpf_map_lookup_elem(&sl_portcrowd_v1, zero);

	if (pc)
		pc->refused_at = err == -EEXIST ? sl_now() : 0;
}

/* port_search_next decides, after try i of a search allowed tries, whether
 * it goes on: only while the port tried was taken and tries remain. When it
 * ends, its outcome is recorded for port_tries. Called from the bpf_loop
 * callbacks, whose frames hold its map lookups: the callers' are deep. */
static __always_inline long port_search_next(const __u32 *zero, __u64 i, __u32 tries, int err)
{
	if (err == -EEXIST && i + 1 < tries)
		return 0;
	port_search_done(zero, err);
	return 1;
}

/* A destination whose source ports a full search found all taken: the
 * backend's address and port, the address the flow would leave with (the
 * node's, or a remapped client's own) and the protocol, as a reverse key
 * whose dport is 0. For SNAT_FULL_NS after, a new flow to it that cannot
 * keep the client's port is refused without a search (snat_full_refused,
 * snat_full_note).
 * Without it, a SYN flood to a NodePort whose SNAT ports have run out pays
 * PORT_TRIES_CROWDED cold probes a SYN, most of what such a SYN costs, and
 * the node's other traffic pays for the core it takes (bench:
 * BenchmarkNodePortPacketRate's flood, BenchmarkRemapSearch).
 *
 * Only a full search (PORT_TRIES) marks: 128 random ports all taken means
 * nearly the whole range is (at 95 %, one search in 700 fails), where a
 * crowded CPU's 8 would mark a range a fifth free. The first search to a
 * marked destination after SNAT_FULL_NS is a full one whatever its CPU's
 * crowding, and marks it again if it fails: a flood pays one full search a
 * destination per SNAT_FULL_NS, and ports that free are searched for again
 * within it (as few as without the mark: a crowded search's 8 tries rarely
 * find the last free ports of a range either).
 * An expired mark is not removed (the LRU evicts it); it only makes its
 * destination's searches full ones, which succeed as fast as short ones
 * while ports are free. */
struct snat_full {
	__u64 at;	/* host order: sl_now() of the full search that failed */
};
ASSERT_SIZE(struct snat_full, 8);

#define SNAT_FULL_NS		(NS_PER_SEC / 10)
#define SNAT_FULL_ENTRIES	1024

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SNAT_FULL_ENTRIES);
	__type(key, struct ct_key);
	__type(value, struct snat_full);
} sl_snatfull_v1 SEC(".maps");

/* snat_full_refused tells whether a port search for the reverse key's
 * destination is skipped: its mark is younger than SNAT_FULL_NS. An older
 * mark sets *tries to PORT_TRIES, a full search. It clears *dport, the
 * key's (the search draws it). map: sl_snatfull_v1 or sl_snatfull6_v1. */
static __always_inline int snat_full_refused(void *map, void *key, __be16 *dport, __u32 *tries)
{
	*dport = 0;
	struct snat_full *m = bpf_map_lookup_elem(map, key);
	if (!m)
		return 0;
	if (sl_now() - m->at < SNAT_FULL_NS)
		return 1;
	*tries = PORT_TRIES;
	return 0;
}

/* snat_full_note marks the reverse key's destination full at *at after a
 * search whose every try was taken, if it was a full one (tries). It clears
 * *dport, the key's: the flow is refused. Called from the search's last
 * callback, with the new entry's creation time (sl_now() when the flow
 * began, a struct snat_full's layout) as the value: a value of its own
 * would deepen the callbacks' frames, which end the datapath's deepest call
 * chains. */
static __always_inline void snat_full_note(void *map, void *key, __be16 *dport, const __u64 *at, __u32 tries)
{
	if (tries != PORT_TRIES)
		return;
	*dport = 0;
	bpf_map_update_elem(map, key, at, BPF_ANY);
}

/* claim_port tries one random port of the claim's range (a bpf_loop
 * callback; the first try sets how many the search gets, unless the
 * caller set it): it stops the loop
 * once the entry is inserted, on an error other than the port being taken (a
 * full map), or when its tries are spent. */
static long claim_port(__u64 i, void *ctx)
{
	struct port_claim *c = ctx;

	if (!i && !c->tries)
		c->tries = port_tries(&c->zero);
	c->key.dport = bpf_htons(c->lo + bpf_get_prandom_u32() % c->span);
	c->err = bpf_map_update_elem(&sl_ct_v2, &c->key, &c->val, BPF_NOEXIST);
	if (!port_search_next(&c->zero, i, c->tries, c->err))
		return 0;
	if (c->err == -EEXIST)
		snat_full_note(&sl_snatfull_v1, &c->key, &c->key.dport, &c->val.created, c->tries);
	return 1;
}

/* own_tuple tells whether a reverse entry is this flow's own: its forward key
 * is this packet's tuple, the client reopening the connection it had (its
 * forward entry was replaced, or the SYN comes again). */
static __always_inline int own_tuple(const struct ct_value *r, const struct packet *p)
{
	return r->type == CT_REVERSE && r->peer.saddr == p->saddr && r->peer.daddr == p->daddr &&
	       r->peer.sport == p->sport && r->peer.dport == p->dport;
}

/* ct_reopened tells whether a SYN that matched a forward entry opens a new
 * connection on the tuple of one that has ended (the client closed or reset
 * it, or the server reset it): the SYN is then balanced as a new flow, as
 * netfilter replaces a closed conntrack entry, instead of following a flow
 * whose backend may be gone. The ended flow is replaced, as netfilter
 * replaces its TIME_WAIT entry on such a SYN: its forward entry is
 * overwritten by the new flow's (ct_create), and its reverse entry deleted
 * here unless the server closed first. Then the server holds the tuple in
 * TIME_WAIT and the entry stays, so that no other flow takes the tuple (a
 * SYN with another client's timestamps would meet PAWS), until the scanner
 * removes it; the client itself takes it back whenever it is balanced to
 * that backend again (ct_create: own tuple), its timestamps being the ones
 * the server saw. So a client reusing its ports keeps them wherever it is
 * balanced and never draws from the SNAT range (at thousands of connections
 * a second it would otherwise leave a drawn port behind per reuse, held for
 * the server's TIME_WAIT, and exhaust the range). Only the flow's own
 * reverse entry is deleted: its key may have been freed by the scanner and
 * taken since. Only SYNs that hit an entry pay for it. */
__subprog int ct_reopened(const struct packet *p, const struct ct_value *fwd)
{
	struct ct_key peer = fwd->peer;
	struct ct_value *rev = bpf_map_lookup_elem(&sl_ct_v2, &peer);

	if (!(fwd->tcp_seen & (TCP_FLAG_FIN | TCP_FLAG_RST)) && !(rev && (rev->tcp_seen & TCP_FLAG_RST)))
		return 0;
	if (rev && own_tuple(rev, p) && !(rev->tcp_seen & CT_SEEN_FIN_FIRST))
		bpf_map_delete_elem(&sl_ct_v2, &peer);
	return 1;
}

/* superseded tells whether a packet that matched a flow's forward entry
 * starts a new flow instead, to be balanced afresh:
 *  - a SYN (or an SCTP INIT) on the tuple of a flow that ended (ct_reopened);
 *  - a SYN, or a datagram at most once per CT_REFRESH_NS, of a flow tracked
 *    untranslated whose destination has become a frontend since: the
 *    Service was programmed after the flow's first packet (an agent that
 *    starts, a Service just created). Without it, a client retrying from
 *    the same port, or a UDP client with a fixed port, would reach the
 *    bare service IP until the flow expired.
 * Established segments of live flows pay only the checks of their flags and
 * the entry's service id. */
__subprog int superseded(const struct packet *p, const struct ct_value *fwd)
{
	int syn = (p->proto == IPPROTO_TCP || p->proto == IPPROTO_SCTP) &&
		  (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;

	if (syn && ct_reopened(p, fwd)) {
		count(CNT_TUPLE_REUSED);
		return 1;
	}
	if (fwd->svc_id || p->l4_absent)
		return 0;
	if (!syn && !(p->proto != IPPROTO_TCP && sl_now() - fwd->last_seen > CT_REFRESH_NS))
		return 0;
	if (!fe_lookup(p->daddr, p->dport, p->proto))
		return 0;
	count(CNT_FLOW_NOW_SERVICE);
	return 1;
}

/* ct_create writes the reverse entry, then the forward one, and sets *sport to
 * the source port the flow leaves with. With *snat_addr set the source is
 * translated: the client's port is kept when free, else random ones are
 * tried. Without, the reverse tuple is the client's own.
 *
 * The reverse key is the flow's identity at the destination, so it is only
 * ever inserted where it does not exist. When another flow holds it — live,
 * or ended but not yet removed by the conntrack scanner, which keeps a flow
 * whose server closed first for its TIME_WAIT — the new flow would be the
 * same connection there: it keeps the client's address but gets another
 * port, as netfilter's NAT does even for flows no rule translates (its "null
 * binding"), and *snat_addr and *flags say so. Every TCP and UDP flow
 * crossing a workload or data interface is tracked, so the holder may be a
 * Service flow or a direct one, in either order. A held key is never taken
 * over from another flow, not even an ended one: two CPUs starting clashing
 * flows at once could both take it. Only the flow itself takes its key back
 * (own_tuple). It returns -E2BIG when the map is full (the new flow is
 * refused; no live flow is evicted for it), -1 when no entry could be written
 * for another reason. */
static __always_inline int ct_create(const struct packet *p, __u32 svc_id,
				     const struct be_value *be, __be32 *snat_addr,
				     const struct config *cfg, __u8 *flags, enum pol_verdict egress,
				     __be16 *sport)
{
	__u64 now = sl_now();
	struct ct_key fwd_key;
	struct port_claim c = {
		.key = {
			.saddr = be->addr, .daddr = *snat_addr ? *snat_addr : p->saddr,
			.sport = be->port, .dport = p->sport, .proto = p->proto,
		},
		.val = {
			.created = now, .last_seen = now,
			.nat_addr = p->daddr, .nat_port = p->dport,
			.snat_addr = p->saddr, .snat_port = p->sport,
			.svc_id = svc_id, .type = CT_REVERSE, .flags = *flags, .pol_egress = egress,
		},
	};
	int remap = 0, err;

	ct_key_of(p, &fwd_key);
	c.val.peer = fwd_key;
	if (!*snat_addr && (err = bpf_map_update_elem(&sl_ct_v2, &c.key, &c.val, BPF_NOEXIST))) {
		if (err == -E2BIG)
			return -E2BIG;
		struct ct_value *held = bpf_map_lookup_elem(&sl_ct_v2, &c.key);
		if (held && own_tuple(held, p)) {
			if (bpf_map_update_elem(&sl_ct_v2, &c.key, &c.val, BPF_ANY))
				return -1;
		} else {
			remap = 1;
			*snat_addr = p->saddr;
			*flags |= CT_SNAT;
			c.val.flags = *flags;
			count(CNT_TUPLE_REMAPPED);
		}
	}
	if (*snat_addr) {
		/* The reverse key must be unique or replies would reach the wrong
		 * client: keep the client's port when free or held by this
		 * flow's own ended entry (a remap knows it is not), else try
		 * random ones. */
		c.err = remap ? -EEXIST : bpf_map_update_elem(&sl_ct_v2, &c.key, &c.val, BPF_NOEXIST);
		if (c.err == -EEXIST && !remap) {
			struct ct_value *held = bpf_map_lookup_elem(&sl_ct_v2, &c.key);
			if (held && own_tuple(held, p))
				c.err = bpf_map_update_elem(&sl_ct_v2, &c.key, &c.val, BPF_ANY);
		}
		if (c.err == -EEXIST && !snat_full_refused(&sl_snatfull_v1, &c.key, &c.key.dport, &c.tries)) {
			count(CNT_SNAT_PORT_DRAWN);
			port_range(cfg, remap, &c.lo, &c.span);
			bpf_loop(PORT_TRIES, claim_port, &c, 0);
		}
		if (c.err)
			return c.err == -E2BIG ? -E2BIG : -1;
	}

	struct ct_value fwd = {
		.created = now, .last_seen = now, .peer = c.key,
		.nat_addr = be->addr, .nat_port = be->port,
		.snat_addr = *snat_addr, .snat_port = c.key.dport,
		.svc_id = svc_id, .tcp_seen = p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK),
		.type = CT_FORWARD, .flags = *flags, .pol_egress = egress,
	};
	if ((err = bpf_map_update_elem(&sl_ct_v2, &fwd_key, &fwd, BPF_ANY))) {
		bpf_map_delete_elem(&sl_ct_v2, &c.key);
		return err == -E2BIG ? -E2BIG : -1;
	}
	*sport = c.key.dport;
	return 0;
}
