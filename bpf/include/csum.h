/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Checksums computed from scratch, for replies the datapath builds itself. */
#pragma once

#include "common.h"

static __always_inline __u16 csum_fold(__s64 sum)
{
	__u64 s = (__u64)sum;

	/* Folding a 64-bit sum of 16-bit words into 16 bits: three folds leave
	 * no carry (the second leaves at most 17 bits, the third at most 16). */
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~(__u16)s;
}

/* ipv4_hdr_csum: the checksum of a 20-byte IPv4 header whose check field is 0. */
static __always_inline __u16 ipv4_hdr_csum(struct iphdr *ip)
{
	return csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)ip, sizeof(*ip), 0));
}
