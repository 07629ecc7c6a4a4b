/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Maglev consistent hashing (Eisenbud et al., NSDI 2016).
 *
 * A frontend with FE_MAGLEV picks a new flow's backend from its service id's
 * table: a prime number of slots (maglev_size), each an ordinal of the
 * service's cluster backends, built by the NAT syncer from the backends'
 * addresses alone (nat/maglev). A flow's slot is a hash of the client's
 * address and port, never of the node or the address the client reached, so
 * every node with the same backends picks the same one for a flow: a flow an
 * upstream router moves to another node (ECMP rehash, a drained node) keeps
 * its backend there, and when one of N backends leaves, about 1/N of the
 * flows move.
 *
 * Tables are inner maps of sl_maglev_v1, one per service id: the syncer
 * builds a whole new table and then swaps it in with one update, so no
 * packet sees one half built. A service id without a table yet, or a slot
 * naming an ordinal outside the cluster range (a table a moment older than
 * its backends), falls back to the random pick. */
#pragma once

#include "common.h"
#include "consts.h"

/* The table size: a load-time constant (gen.LoadOptions.MaglevTableSize),
 * which also sizes the inner maps' value. */
#define MAGLEV_DEFAULT_SIZE	16381
#define MAGLEV_MAX_SIZE		131071
volatile const __u32 maglev_size = MAGLEV_DEFAULT_SIZE;

/* One table: the value of the inner map's single entry, so a table is
 * written with one update. The loader resizes it to maglev_size slots. */
struct maglev_table {
	__u32 ordinal[MAGLEV_DEFAULT_SIZE];	/* host order: backend ordinals */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH_OF_MAPS);
	__uint(max_entries, SL_MAGLEV_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, __u32);			/* host order: service id */
	__array(values, struct {
		__uint(type, BPF_MAP_TYPE_ARRAY);
		__uint(max_entries, 1);
		__uint(key_size, sizeof(__u32));
		/* By size, not type: the loader resizes it. */
		__uint(value_size, sizeof(struct maglev_table));
	});
} sl_maglev_v1 SEC(".maps");

/* murmur3's 32-bit block mix and finalizer: every input bit moves about half
 * the output bits, so client ports one apart land on unrelated slots. */
static __always_inline __u32 maglev_mix(__u32 h, __u32 k)
{
	k *= 0xcc9e2d51;
	k = (k << 15) | (k >> 17);
	k *= 0x1b873593;
	h ^= k;
	h = (h << 13) | (h >> 19);
	return h * 5 + 0xe6546b64;
}

static __always_inline __u32 maglev_final(__u32 h)
{
	h ^= h >> 16;
	h *= 0x85ebca6b;
	h ^= h >> 13;
	h *= 0xc2b2ae35;
	return h ^ (h >> 16);
}

/* The seed is the same on every node: it is what makes their picks agree. */
#define MAGLEV_SEED 0x5ec7e11a

static __always_inline __u32 maglev_hash4(__be32 client, __be16 sport)
{
	return maglev_final(maglev_mix(maglev_mix(MAGLEV_SEED, client), sport) ^ 6);
}

static __always_inline __u32 maglev_hash6(const __u8 *client, __be16 sport)
{
	__u32 w[4];
	__u32 h = MAGLEV_SEED;

	__builtin_memcpy(w, client, sizeof(w));
	for (int i = 0; i < 4; i++)
		h = maglev_mix(h, w[i]);
	return maglev_final(maglev_mix(h, sport) ^ 18);
}

/* maglev_pick sets *ordinal to the table's choice for hash, when the
 * service id has a table and the choice is one of the n cluster backends
 * from first; otherwise *ordinal stays (the random pick). A subprogram: the
 * new-flow path's frames sit at the verifier's limit. */
__subprog int maglev_pick(__u32 svc_id, __u32 hash, __u32 first, __u32 n, __u32 *ordinal)
{
	__u32 zero = 0;
	void *inner = bpf_map_lookup_elem(&sl_maglev_v1, &svc_id);

	if (!inner)
		return 0;
	struct maglev_table *t = bpf_map_lookup_elem(inner, &zero);
	if (!t)
		return 0;
	__u32 slot = hash % maglev_size;
	/* The verifier knows maglev_size (read-only data); the compiler must
	 * not drop the bound as implied by the modulo. */
	asm volatile("" : "+r"(slot));
	if (slot >= maglev_size || slot >= MAGLEV_MAX_SIZE)
		return 0;
	__u32 o = t->ordinal[slot];
	if (o - first < n)
		*ordinal = o;
	return 0;
}
