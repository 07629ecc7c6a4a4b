/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6: addresses, the header, and the parser that walks extension headers into
 * a struct packet6.
 *
 * IPv6 has maps of its own (the *6 maps: 16-byte addresses), so the IPv4 maps
 * keep their small keys and the IPv4 path pays nothing for the second family
 * but one branch on skb->protocol (bench/README.md "IPv6"). A struct packet6
 * carries a struct packet for everything that does not depend on the family
 * (offsets, ports, protocol, flags), so the L4 parser, the per-service counters
 * and the port rewrites serve both families; its own saddr/daddr stay 0.
 *
 * Rules (README "Datapath rules"):
 *  - Hop-by-hop, routing, destination options, fragment and authentication
 *    headers are walked, at most IPV6_EXT_MAX of them; a packet with more,
 *    one cut short inside them, or one whose L4 header starts beyond
 *    IPV6_L4_OFF_MAX, is PARSE_MALFORMED. Anything else (ESP, no next
 *    header, an unknown protocol) ends the walk: its protocol is the packet's.
 *  - A fragment header makes the packet a fragment; a non-zero fragment offset
 *    means no L4 header (l4_absent), as in IPv4 (frag6 below).
 *  - A payload length of 0 (a jumbogram, or a GSO packet of BIG TCP) takes its
 *    length from the skb. */
#pragma once

#include "common.h"
#include "consts.h"
#include "parse.h"

#ifndef ETH_P_IPV6
#define ETH_P_IPV6		0x86DD
#endif

/* Extension headers (RFC 8200 4.1, RFC 4302); <linux/in6.h> names them, but
 * pulls in definitions that clash with <linux/in.h>. */
#define NEXTHDR_HOP		0
#define NEXTHDR_ROUTING		43
#define NEXTHDR_FRAGMENT	44
#define NEXTHDR_AUTH		51
#define NEXTHDR_DEST		60

/* At most this many extension headers are walked (the verifier needs a bound;
 * real traffic carries one or two). */
#define IPV6_EXT_MAX		8
#define IPV6_HLEN		40
/* The L4 header must start within this many bytes of the frame: bounds the
 * parser's offsets for the verifier, and is far beyond any real header chain
 * (RFC 7112 wants the whole chain in the first fragment). */
#define IPV6_L4_OFF_MAX		2048
/* The smallest all-ones mask that IPV6_L4_OFF_MAX fits under. */
#define IPV6_L4_OFF_MASK	4095

/* The fixed IPv6 header without bitfields. */
struct ip6_raw {
	__be32 ver_tc_flow;	/* version, traffic class, flow label */
	__be16 payload_len;
	__u8 nexthdr;
	__u8 hop_limit;
	__u8 saddr[16];
	__u8 daddr[16];
};
_Static_assert(sizeof(struct ip6_raw) == IPV6_HLEN, "ipv6 header");

#define IP6_SADDR_OFF		offsetof(struct ip6_raw, saddr)
#define IP6_DADDR_OFF		offsetof(struct ip6_raw, daddr)

struct packet6 {
	struct packet p;	/* everything but the addresses (parse.h); p.saddr,
				 * p.daddr and p.ip_id are 0. p.ip_len is the IPv6
				 * header plus payload, p.ttl the hop limit, p.proto
				 * the upper-layer protocol after the extension
				 * headers */
	__u8 saddr[16];		/* network order */
	__u8 daddr[16];		/* network order */
	__be32 frag_id;		/* network order: the fragment header's identification */
};

/* 16-byte addresses as two 64-bit words: copies and compares in two moves. */
static __always_inline void addr6_copy(__u8 *dst, const __u8 *src)
{
	__builtin_memcpy(dst, src, 16);
}

static __always_inline int addr6_eq(const __u8 *a, const __u8 *b)
{
	__u64 x[2], y[2];

	__builtin_memcpy(x, a, 16);
	__builtin_memcpy(y, b, 16);
	return x[0] == y[0] && x[1] == y[1];
}

static __always_inline int addr6_is_zero(const __u8 *a)
{
	__u64 x[2];

	__builtin_memcpy(x, a, 16);
	return !(x[0] | x[1]);
}

static __always_inline int is_ext_header(__u8 next)
{
	return next == NEXTHDR_HOP || next == NEXTHDR_ROUTING || next == NEXTHDR_DEST ||
	       next == NEXTHDR_FRAGMENT || next == NEXTHDR_AUTH;
}

/* parse_ipv6 reads the IPv6 header at p6->p.l3_off and walks the extension
 * headers after it. */
static __always_inline int parse_ipv6(struct __sk_buff *skb, struct packet6 *p6)
{
	struct packet *p = &p6->p;
	struct ip6_raw ip;

	if (bpf_skb_load_bytes(skb, p->l3_off, &ip, sizeof(ip)))
		return PARSE_MALFORMED;
	if ((bpf_ntohl(ip.ver_tc_flow) >> 28) != 6)
		return PARSE_MALFORMED;
	__u32 len = IPV6_HLEN + bpf_ntohs(ip.payload_len);
	if (!ip.payload_len)
		len = skb->len - p->l3_off;
	if (skb->len < p->l3_off + len)
		return PARSE_MALFORMED;
	p->ip_len = len > 0xffff ? 0xffff : len;
	p->ttl = ip.hop_limit;
	addr6_copy(p6->saddr, ip.saddr);
	addr6_copy(p6->daddr, ip.daddr);

	__u32 off = p->l3_off + IPV6_HLEN;
	__u8 next = ip.nexthdr;
	for (int i = 0; i < IPV6_EXT_MAX && is_ext_header(next); i++) {
		__u8 h[8];

		if (bpf_skb_load_bytes(skb, off, h, sizeof(h)))
			return PARSE_MALFORMED;
		if (next == NEXTHDR_FRAGMENT) {
			/* next header, reserved, offset (13 bits) | M, identification */
			__be16 frag_off;
			__builtin_memcpy(&frag_off, h + 2, 2);
			__builtin_memcpy(&p6->frag_id, h + 4, 4);
			p->fragment = 1;
			p->l4_absent = (frag_off & bpf_htons(0xfff8)) != 0;
			off += 8;
		} else if (next == NEXTHDR_AUTH) {
			off += ((__u32)h[1] + 2) * 4;	/* in 4-byte units, minus 2 */
		} else {
			off += ((__u32)h[1] + 1) * 8;	/* in 8-byte units, minus 1 */
		}
		next = h[0];
	}
	if (is_ext_header(next) || off > p->l3_off + len || off > IPV6_L4_OFF_MAX)
		return PARSE_MALFORMED;
	/* Each way through the extension headers leaves off in a range of its
	 * own, and the verifier would check the rest of the pipeline once for
	 * each; masked (off is at most IPV6_L4_OFF_MAX already, so nothing
	 * changes), the ways with extension headers share one range. */
	if (off != p->l3_off + IPV6_HLEN)
		asm volatile("%0 &= %1" : "+r"(off) : "i"(IPV6_L4_OFF_MASK));
	p->l4_off = off;
	p->proto = next;
	return PARSE_OK;
}

/* parse_packet6: the link layer, then IPv6, then L4. Called for a packet
 * whose skb->protocol is IPv6; l2_len as parse_packet's. A subprogram:
 * the parser's buffers stay off the pipeline's frame. */
__subprog int parse_packet6(struct __sk_buff *skb, struct packet6 *p6, const __u32 l2_len)
{
	__builtin_memset(p6, 0, sizeof(*p6));
	p6->p.l3_off = l2_len;
	if (l2_len) {
		__be16 proto;
		if (bpf_skb_load_bytes(skb, offsetof(struct ethhdr, h_proto), &proto, sizeof(proto)))
			return PARSE_MALFORMED;
		if (proto != bpf_htons(ETH_P_IPV6))
			return PARSE_NOT_IPV4; /* VLAN and the like: passed untouched */
	}
	int r = parse_ipv6(skb, p6);
	if (r != PARSE_OK)
		return r;
	if (p6->p.proto == IPPROTO_ICMPV6 && !p6->p.l4_absent) {
		/* Its type and code; ICMPv6 is not tracked, so its echo
		 * identifier is not read as ports. (parse_l4 leaves ICMPv6 out:
		 * a case more there costs the IPv4 entry programs a stack slot.) */
		__u8 tc[2];
		if (bpf_skb_load_bytes(skb, p6->p.l4_off, tc, sizeof(tc)) ||
		    p6->p.l3_off + p6->p.ip_len < p6->p.l4_off + sizeof(struct icmphdr))
			return PARSE_MALFORMED;
		p6->p.icmp_type = tc[0];
		p6->p.icmp_code = tc[1];
		return PARSE_OK;
	}
	return parse_l4(skb, &p6->p);
}
