/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv4 fragments (sl_frag_v1). Only a datagram's first fragment carries the L4
 * header, so only it can be matched to a flow by its ports. The first fragment
 * records its ports under {source, destination, IP id, protocol}, as it arrived
 * at this hook; later fragments of the datagram find them there and are
 * translated like the first (addresses only: they have no L4 header, and the
 * L4 checksum, which covers the whole datagram, is in the first fragment).
 *
 * A later fragment whose first fragment was not seen (out of order, lost, or
 * expired) cannot be matched to a flow: it is counted and dropped when its
 * destination is a service IP (it must never reach a Service untranslated),
 * and passed otherwise. Duplicate and overlapping fragments look up the same
 * entry; reassembly is the receiver's. Entries expire after FRAG_TIMEOUT_NS
 * (Linux's ipfrag_time) and are evicted LRU. */
#pragma once

#include "common.h"
#include "consts.h"
#include "parse.h"

struct frag_key {
	__be32 saddr;		/* network order */
	__be32 daddr;		/* network order */
	__be16 id;		/* network order: the IPv4 identification */
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad;		/* 0 */
};
ASSERT_SIZE(struct frag_key, 12);

struct frag_value {
	__u64 created;		/* host order: sl_now() of the first fragment */
	__be16 sport;		/* network order: the first fragment's ports */
	__be16 dport;		/* network order */
	__u32 pad;		/* 0 */
};
ASSERT_SIZE(struct frag_value, 16);

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_FRAG_MAX);
	__type(key, struct frag_key);
	__type(value, struct frag_value);
} sl_frag_v1 SEC(".maps");

static __always_inline void frag_key_of(const struct packet *p, struct frag_key *k)
{
	__builtin_memset(k, 0, sizeof(*k));
	k->saddr = p->saddr;
	k->daddr = p->daddr;
	k->id = p->ip_id;
	k->proto = p->proto;
}

/* frag_learn records a first fragment's ports for the fragments that follow. */
static __always_inline void frag_learn(const struct packet *p)
{
	struct frag_key k;
	struct frag_value v = { .created = sl_now(), .sport = p->sport, .dport = p->dport };

	frag_key_of(p, &k);
	bpf_map_update_elem(&sl_frag_v1, &k, &v, BPF_ANY);
}

/* frag_ports fills in a later fragment's ports from its first fragment; it
 * returns -1 when the first fragment is unknown or expired. */
static __always_inline int frag_ports(struct packet *p)
{
	struct frag_key k;

	frag_key_of(p, &k);
	struct frag_value *v = bpf_map_lookup_elem(&sl_frag_v1, &k);
	if (!v || sl_now() - v->created > FRAG_TIMEOUT_NS)
		return -1;
	p->sport = v->sport;
	p->dport = v->dport;
	return 0;
}
