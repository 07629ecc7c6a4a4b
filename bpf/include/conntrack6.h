/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 conntrack (sl_ct6_v1) and fragments (sl_frag6_v1): the twins of
 * conntrack.h, ct_new.h and frag.h with 16-byte addresses. The layout rules,
 * the clash rules and the scanner's contract are the IPv4 ones, documented
 * there; the entry's type, flags, tcp_seen marks and policy verdicts are the
 * same enums, so userspace reads both maps with one set of rules. */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "consts.h"
#include "counters.h"
#include "ct_new.h"
#include "ipv6.h"
#include "service6.h"

struct ct6_key {
	__u8 saddr[16];		/* network order */
	__u8 daddr[16];		/* network order */
	__be16 sport;		/* network order */
	__be16 dport;		/* network order */
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad[3];		/* 0 */
};
ASSERT_SIZE(struct ct6_key, 40);

struct ct6_value {
	__u64 created;		/* host order, as ct_value's */
	__u64 last_seen;	/* host order */
	struct ct6_key peer;	/* the other entry of the pair */
	__u8 nat_addr[16];	/* network order, as ct_value's */
	__u8 snat_addr[16];	/* network order, as ct_value's */
	__be16 nat_port;	/* network order */
	__be16 snat_port;	/* network order */
	__u32 svc_id;		/* host order */
	__u32 tcp_seen;		/* host order: TCP_FLAG_* and enum ct_seen */
	enum ct_type type;
	enum ct_flags flags;
	enum pol_verdict pol_egress;
	enum pol_verdict pol_ingress;
	__u32 pad[2];		/* 0 */
};
ASSERT_SIZE(struct ct6_value, 112);

/* A plain hash, as sl_ct_v2: full means new flows are refused, never that
 * established ones are evicted. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_CT_MAX);
	__type(key, struct ct6_key);
	__type(value, struct ct6_value);
} sl_ct6_v1 SEC(".maps");

/* The IPv6 conntrack table a resize replaces, as sl_ctprev_v1 (conntrack.h). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY_OF_MAPS);
	__uint(max_entries, 1);
	__type(key, __u32);
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_HASH);
		__uint(max_entries, 1);
		__type(key, struct ct6_key);
		__type(value, struct ct6_value);
	});
} sl_ctprev6_v1 SEC(".maps");

/* ct6_from_previous is ct_from_previous (conntrack.h) for IPv6. */
__subprog __attribute__((unused)) int ct6_from_previous(const struct ct6_key *key)
{
	__u32 slot = 0;
	void *prev = bpf_map_lookup_elem(&sl_ctprev6_v1, &slot);
	struct ct6_value *old, *peer;

	if (!prev)
		return 0;
	old = bpf_map_lookup_elem(prev, key);
	if (!old)
		return 0;
	peer = bpf_map_lookup_elem(prev, &old->peer);
	if (peer)
		bpf_map_update_elem(&sl_ct6_v1, &old->peer, peer, BPF_NOEXIST);
	bpf_map_update_elem(&sl_ct6_v1, key, old, BPF_NOEXIST);
	return 1;
}

/* The addresses of an IPv6 flow handed to a policy program: they do not fit
 * in skb->cb, which carries the rest of the tuple as for IPv4 (policy.h). */
struct policy6_tuple {
	__u8 saddr[16];		/* network order */
	__u8 daddr[16];		/* network order */
};
ASSERT_SIZE(struct policy6_tuple, 32);

/* Per-CPU scratch space where ct6_create builds a flow's entries (on the
 * stack they would take the IPv6 path over the verifier's 512 bytes: a
 * stage's frame adds to the entry program's and the pipeline's), an ICMPv6
 * error's lookup its key, and the policy hand-off leaves an IPv6 tuple for
 * the policy program and the verdict program it tail-calls on the same
 * CPU. It holds nothing from one packet to the next. */
struct ct6_scratch {
	struct ct6_key rev_key;
	struct ct6_value v;
	struct policy6_tuple pol;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct ct6_scratch);
} sl_scratch6_v1 SEC(".maps");

static __always_inline void ct6_key_of(const struct packet6 *p6, struct ct6_key *k)
{
	__u32 last = proto_word(p6->p.proto);

	/* A word at a time, as ct_key_of (conntrack.h) writes its key. */
	addr6_copy(k->saddr, p6->saddr);
	addr6_copy(k->daddr, p6->daddr);
	__builtin_memcpy(&k->sport, &p6->p.sport, 4);
	__builtin_memcpy(&k->proto, &last, 4);
}

static __always_inline struct ct6_value *ct6_lookup_reversed(const struct packet6 *p6)
{
	struct ct6_key rk = { .sport = p6->p.dport, .dport = p6->p.sport, .proto = p6->p.proto };

	addr6_copy(rk.saddr, p6->daddr);
	addr6_copy(rk.daddr, p6->saddr);
	return bpf_map_lookup_elem(&sl_ct6_v1, &rk);
}

__subprog enum ct_seen fin_first6(const struct ct6_key *peer)
{
	struct ct6_value *o = bpf_map_lookup_elem(&sl_ct6_v1, peer);

	return o && (o->tcp_seen & TCP_FLAG_FIN) ? (enum ct_seen)0 : CT_SEEN_FIN_FIRST;
}

/* ct6_touch: ct_touch (conntrack.h). */
static __always_inline void ct6_touch(struct ct6_value *v, const struct packet *p)
{
	__u64 now = sl_now_tick();

	if (now - v->last_seen > CT_REFRESH_NS)
		v->last_seen = now;
	if (p->proto == IPPROTO_TCP || p->proto == IPPROTO_SCTP) {
		__u32 f = p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST | TCP_FLAG_ACK);
		if ((v->tcp_seen | f) != v->tcp_seen) {
			if ((f & ~v->tcp_seen) & TCP_FLAG_FIN)
				f |= fin_first6(&v->peer);
			__sync_fetch_and_or(&v->tcp_seen, f);
		}
	} else if (!(v->tcp_seen & CT_SEEN_PACKET)) {
		__sync_fetch_and_or(&v->tcp_seen, CT_SEEN_PACKET);
	}
}

static __always_inline int own_tuple6(const struct ct6_value *r, const struct packet6 *p6)
{
	return r->type == CT_REVERSE && addr6_eq(r->peer.saddr, p6->saddr) && addr6_eq(r->peer.daddr, p6->daddr) &&
	       r->peer.sport == p6->p.sport && r->peer.dport == p6->p.dport;
}

/* superseded6: superseded (ct_new.h). */
__subprog int superseded6(const struct packet6 *p6, const struct ct6_value *fwd)
{
	const struct packet *p = &p6->p;
	int syn = (p->proto == IPPROTO_TCP || p->proto == IPPROTO_SCTP) &&
		  (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;

	if (syn) {
		int ended = fwd->tcp_seen & (TCP_FLAG_FIN | TCP_FLAG_RST);
		if (!ended) {
			struct ct6_key peer = fwd->peer;
			struct ct6_value *rev = bpf_map_lookup_elem(&sl_ct6_v1, &peer);
			ended = rev && (rev->tcp_seen & TCP_FLAG_RST);
		}
		if (ended) {
			/* The ended flow is replaced whole (ct_reopened). */
			struct ct6_key peer = fwd->peer;
			struct ct6_value *rev = bpf_map_lookup_elem(&sl_ct6_v1, &peer);
			if (rev && own_tuple6(rev, p6) && !(rev->tcp_seen & CT_SEEN_FIN_FIRST))
				bpf_map_delete_elem(&sl_ct6_v1, &peer);
			count(CNT_TUPLE_REUSED);
			return 1;
		}
	}
	if (fwd->svc_id || p->l4_absent)
		return 0;
	if (!syn && !(p->proto != IPPROTO_TCP && sl_now() - fwd->last_seen > CT_REFRESH_NS))
		return 0;
	if (!fe6_lookup(p6->daddr, p->dport, p->proto))
		return 0;
	count(CNT_FLOW_NOW_SERVICE);
	return 1;
}

/* port_claim6 is an IPv6 search for a free reverse tuple (port_claim): the
 * entry to insert is this CPU's scratch one. */
struct port_claim6 {
	__u32 lo, span;		/* host order: ports lo .. lo + span - 1 */
	__u32 tries;		/* how many the search gets (port_tries) */
	int err;		/* the last insertion's: 0 once claimed */
};

/* sl_snatfull6_v1: IPv6 destinations whose source ports a full search found
 * all taken (sl_snatfull_v1, ct_new.h). */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SNAT_FULL_ENTRIES);
	__type(key, struct ct6_key);
	__type(value, struct snat_full);
} sl_snatfull6_v1 SEC(".maps");

/* claim_port6 tries one random port for the scratch reverse entry (claim_port). */
static long claim_port6(__u64 i, void *ctx)
{
	struct port_claim6 *c = ctx;
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);

	if (!sc) {
		c->err = -1;
		return 1;
	}
	if (!i && !c->tries)
		c->tries = port_tries(&zero);
	sc->rev_key.dport = bpf_htons(c->lo + bpf_get_prandom_u32() % c->span);
	c->err = bpf_map_update_elem(&sl_ct6_v1, &sc->rev_key, &sc->v, BPF_NOEXIST);
	if (!port_search_next(&zero, i, c->tries, c->err))
		return 0;
	if (c->err == -EEXIST)
		snat_full_note(&sl_snatfull6_v1, &sc->rev_key, &sc->rev_key.dport, &sc->v.created, c->tries);
	return 1;
}

/* ct6_create: ct_create (ct_new.h), whose comment states the rules.
 * fwd_key is the packet's own tuple (ct6_key_of), which the caller has
 * already built for its lookup. With *snat set the source is translated to
 * snat_addr (the node's address, or the client's own when only its port is
 * remapped, which snat_addr then holds). */
static __always_inline int ct6_create(const struct packet6 *p6, const struct ct6_key *fwd_key, __u32 svc_id,
				      const struct be6_value *be, int *snat, __u8 *snat_addr, __u8 *flags,
				      enum pol_verdict egress, __be16 *sport)
{
	const struct packet *p = &p6->p;
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
	if (!sc)
		return -1;
	struct ct6_key *rev_key = &sc->rev_key;
	struct ct6_value *v = &sc->v;
	__u64 now = sl_now();
	int remap = 0, err;

	__builtin_memset(sc, 0, offsetof(struct ct6_scratch, pol));
	addr6_copy(rev_key->saddr, be->addr);
	addr6_copy(rev_key->daddr, *snat ? snat_addr : p6->saddr);
	rev_key->sport = be->port;
	rev_key->dport = p->sport;
	rev_key->proto = p->proto;
	v->created = now;
	v->last_seen = now;
	v->peer = *fwd_key;
	addr6_copy(v->nat_addr, p6->daddr);
	v->nat_port = p->dport;
	addr6_copy(v->snat_addr, p6->saddr);
	v->snat_port = p->sport;
	v->svc_id = svc_id;
	v->type = CT_REVERSE;
	v->flags = *flags;
	v->pol_egress = egress;	/* pol_ingress: unjudged, as ct_create's */

	/* The client's port is kept when the reverse key is free, or held by
	 * this flow's own ended entry; otherwise a flow that keeps the client's
	 * address is remapped (a clash), and any translated flow draws a port. */
	struct port_claim6 c = {.err = bpf_map_update_elem(&sl_ct6_v1, rev_key, v, BPF_NOEXIST)};
	if (c.err == -EEXIST) {
		struct ct6_value *held = bpf_map_lookup_elem(&sl_ct6_v1, rev_key);
		if (held && own_tuple6(held, p6)) {
			c.err = bpf_map_update_elem(&sl_ct6_v1, rev_key, v, BPF_ANY);
		} else if (!*snat) {
			remap = 1;
			*snat = 1;
			addr6_copy(snat_addr, p6->saddr);
			*flags |= CT_SNAT;
			v->flags = *flags;
			count(CNT_TUPLE_REMAPPED);
		}
	}
	if (c.err == -EEXIST && !snat_full_refused(&sl_snatfull6_v1, rev_key, &rev_key->dport, &c.tries)) {
		count(CNT_SNAT_PORT_DRAWN);
		port_range(config_get(), remap, &c.lo, &c.span);
		bpf_loop(PORT_TRIES, claim_port6, &c, 0);
	}
	if (c.err)
		return c.err == -E2BIG ? -E2BIG : -1;

	/* The same value, turned into the forward entry. */
	v->peer = *rev_key;
	addr6_copy(v->nat_addr, be->addr);
	v->nat_port = be->port;
	if (*snat)
		addr6_copy(v->snat_addr, snat_addr);
	else
		__builtin_memset(v->snat_addr, 0, sizeof(v->snat_addr));
	v->snat_port = rev_key->dport;
	v->tcp_seen = p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK);
	v->type = CT_FORWARD;
	if ((err = bpf_map_update_elem(&sl_ct6_v1, fwd_key, v, BPF_ANY))) {
		bpf_map_delete_elem(&sl_ct6_v1, rev_key);
		return err == -E2BIG ? -E2BIG : -1;
	}
	*sport = rev_key->dport;
	return 0;
}

/* ---- Fragments: frag.h's rules, keyed by the fragment header's 32-bit id ---- */

struct frag6_key {
	__u8 saddr[16];		/* network order */
	__u8 daddr[16];		/* network order */
	__be32 id;		/* network order: the fragment header's identification */
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad[3];		/* 0 */
};
ASSERT_SIZE(struct frag6_key, 40);

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_FRAG_MAX);
	__type(key, struct frag6_key);
	__type(value, struct frag_value);
} sl_frag6_v1 SEC(".maps");

static __always_inline void frag6_key_of(const struct packet6 *p6, struct frag6_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	addr6_copy(k->saddr, p6->saddr);
	addr6_copy(k->daddr, p6->daddr);
	k->id = p6->frag_id;
	k->proto = p6->p.proto;
}

static __always_inline void frag6_learn(const struct packet6 *p6)
{
	struct frag6_key k;
	struct frag_value v = { .created = sl_now(), .sport = p6->p.sport, .dport = p6->p.dport };

	frag6_key_of(p6, &k);
	bpf_map_update_elem(&sl_frag6_v1, &k, &v, BPF_ANY);
}

static __always_inline int frag6_ports(struct packet6 *p6)
{
	struct frag6_key k;

	frag6_key_of(p6, &k);
	struct frag_value *v = bpf_map_lookup_elem(&sl_frag6_v1, &k);
	if (!v || sl_now() - v->created > FRAG_TIMEOUT_NS)
		return -1;
	p6->p.sport = v->sport;
	p6->p.dport = v->dport;
	return 0;
}
