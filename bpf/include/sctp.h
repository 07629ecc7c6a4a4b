/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* SCTP (RFC 9260): what the datapath reads of it and how it keeps its
 * checksum right through a translation.
 *
 * An SCTP packet's common header leads with its ports, as TCP's and UDP's
 * headers do, so conntrack, the service lookup and policy read them alike.
 * Its first chunk's type says where the association stands; the parser
 * records it in the TCP flag bits conntrack keeps per direction
 * (sctp_seen_flags), which the conntrack scanner reads with SCTP's own
 * timeouts (conntrack/timeouts.go).
 *
 * The checksum is CRC32c over the SCTP packet alone, with no pseudo header:
 * an address translation leaves it be. A port translation changes it, and no
 * ones'-complement helper updates a CRC. But a CRC is linear: for two
 * packets of one length L that differ in their first 4 bytes by d (read as
 * a little-endian word, as the CRC consumes them), the CRCs differ by
 * d * x^(8L) mod P, in the reflected representation the CRC state has. So
 * the update is one product with x^(8L), built from the powers x^(8 * 2^k)
 * that L's bits select: 17 products of 32 branchless steps, for any length,
 * where recomputing would read the whole packet. Only when the
 * ports change; with CHECKSUM_PARTIAL (an SCTP socket on this node whose
 * device computes the CRC) the field is the device's to fill, and stays.
 *
 * A fragment's L is not known (the datagram's length is in its last
 * fragment): a first fragment whose ports change cannot be given its CRC,
 * and is refused (sctp_rewrite_ports, rewrite.h, fails). SCTP fragments its messages into
 * chunks itself, to the path MTU, so IP fragments of SCTP are rare. */
#pragma once

#include "common.h"

#define SCTP_COMMON_HLEN	12	/* the common header: ports, tag, checksum */

/* Chunk types (RFC 9260 3.2) that move an association's state. */
#define SCTP_CHUNK_INIT			1
#define SCTP_CHUNK_INIT_ACK		2
#define SCTP_CHUNK_ABORT		6
#define SCTP_CHUNK_SHUTDOWN		7
#define SCTP_CHUNK_SHUTDOWN_ACK		8
#define SCTP_CHUNK_SHUTDOWN_COMPLETE	14

/* sctp_seen_flags: what a packet whose first chunk is of type chunk says,
 * in the TCP flag bits conntrack records (ct_touch):
 *   INIT                          SYN      (an association opens: as a SYN, it
 *                                           may reopen an ended flow's tuple)
 *   INIT ACK                      SYN|ACK  (the destination answered)
 *   SHUTDOWN, SHUTDOWN ACK        FIN      (an orderly close)
 *   ABORT, SHUTDOWN COMPLETE      RST      (the association is gone)
 *   anything else (DATA, SACK,    ACK      (the association is up)
 *   HEARTBEAT, COOKIE ECHO/ACK)
 * A packet of the common header alone says nothing (0). */
static __always_inline __u8 sctp_seen_flags(__u8 chunk)
{
	switch (chunk) {
	case SCTP_CHUNK_INIT:
		return TCP_FLAG_SYN;
	case SCTP_CHUNK_INIT_ACK:
		return TCP_FLAG_SYN | TCP_FLAG_ACK;
	case SCTP_CHUNK_SHUTDOWN:
	case SCTP_CHUNK_SHUTDOWN_ACK:
		return TCP_FLAG_FIN;
	case SCTP_CHUNK_ABORT:
	case SCTP_CHUNK_SHUTDOWN_COMPLETE:
		return TCP_FLAG_RST;
	}
	return TCP_FLAG_ACK;
}

#define CRC32C_POLY	0x82f63b78	/* Castagnoli, reflected */

/* The CRC consumes the packet's bytes as little-endian words, and the
 * update reads the ports and the stored CRC as the CPU loads them: so on a
 * little-endian CPU, the only kind the programs are built for (bpfel). */
#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "sctp.h: the CRC32c update assumes a little-endian target"
#endif

/* crc32c_mul: a * b mod P, both in the reflected representation (bit 31 is
 * x^0). Branchless, so the verifier walks one path through its 32 steps. */
static __always_inline __u32 crc32c_mul(__u32 a, __u32 b)
{
	__u32 prod = 0;

	for (int i = 0; i < 32; i++) {
		prod ^= b & -((a >> (31 - i)) & 1);
		b = (b >> 1) ^ (CRC32C_POLY & -(b & 1));
	}
	return prod;
}

/* crc32c_zero_bytes_pow: x^(8 * 2^k) mod P for k = 0..15, reflected; the
 * first is x^8, each the square of the one before (gen/datapathtest checks
 * them against Go's CRC32c). Multiplying a CRC state by x^(8n) appends n
 * zero bytes to the message. */
static const __u32 crc32c_zero_bytes_pow[16] = {
	0x00800000, 0x00008000, 0x82f63b78, 0x6ea2d55c,
	0x18b8ea18, 0x510ac59a, 0xb82be955, 0xb8fdb1e7,
	0x88e56f72, 0x74c360a4, 0xe4172b16, 0x0d65762a,
	0x35d73a62, 0x28461564, 0xbf455269, 0xe2ea32dc,
};

/* sctp_crc_delta: what an SCTP packet of len bytes (its common header on)
 * adds to its CRC when its first 4 bytes change by d (old ^ new, as a
 * little-endian word). A global function: the verifier checks its 8,000
 * steps once, with any arguments, where a static one is walked again on
 * every way the pipeline reaches it; and it needs no stack. */
__attribute__((noinline)) __u32 sctp_crc_delta(__u32 d, __u32 len)
{
	__u32 x = 0x80000000; /* x^0 */

	for (int k = 0; k < 16; k++) {
		__u32 step = crc32c_mul(x, crc32c_zero_bytes_pow[k]);
		__u32 take = -((len >> k) & 1);
		/* Opaque to the compiler, which would make the select a
		 * branch: the verifier, which knows the powers' values, would
		 * then walk each of 2^16 ways through the loop apart. */
		asm volatile("" : "+r"(take));
		x = (step & take) | (x & ~take);
	}
	return crc32c_mul(d, x);
}
