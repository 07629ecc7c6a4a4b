/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The hash of a conntrack key for an open-addressing table in an array map
 * (bpf/tablefloor.c, and the table conntrack of
 * bench/experiments/table-conntrack.patch). */
#pragma once

#include "common.h"
#include "conntrack.h"

/* fmix64 is MurmurHash3's finalizer: every input bit moves every output
 * bit, as linear probing needs (a weaker mix of these keys, which differ
 * only in a few bytes, piles them into long runs). */
static __always_inline __u64 fmix64(__u64 h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	h *= 0xc4ceb9fe1a85ec53ull;
	h ^= h >> 33;
	return h;
}

static __always_inline __u32 table_hash(const struct ct_key *k)
{
	__u64 w[2];

	__builtin_memcpy(w, k, sizeof(w));
	return (__u32)fmix64(fmix64(w[0]) ^ w[1]);
}
