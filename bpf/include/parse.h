/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing: the link layer, IPv4, TCP/UDP/SCTP/ICMP into a struct packet.
 *
 * The parser records offsets and copies of the fields the datapath needs, so later
 * stages rewrite the packet with skb helpers by offset and never hold a packet
 * pointer across a helper call that may move the data.
 *
 * The link layer is a compile-time argument (l2_len): ETH_HLEN for Ethernet
 * devices, 0 for L3 devices (ipip, WireGuard, TUN) whose packets start with the
 * IP header. Each entry program is built for one of them, so the choice costs
 * nothing per packet; the attach manager picks the program by the device's
 * link type.
 *
 * Rules (documented in README "Datapath rules"):
 *  - Anything that is not IPv4 is PARSE_NOT_IPV4 and passes untouched (IPv6
 *    has its own parser in ipv6.h, which hands over to parse_l4 here).
 *  - An IPv4 header shorter than 20 bytes, a header length field below 5, a total
 *    length shorter than the header, or an L4 header cut short is PARSE_MALFORMED.
 *  - IP options are skipped using the header length; they do not change the verdict.
 *  - Fragments (MF set or a non-zero offset) are flagged. A first fragment
 *    carries the L4 header and is parsed like any packet; a later fragment has
 *    no L4 header (l4_absent) and gets its ports from the first (frag.h).
 */
#pragma once

#include "common.h"
#include "sctp.h"

#define IP_DF		0x4000
#define IP_MF		0x2000
#define IP_OFFSET	0x1fff


enum parse_result {
	PARSE_OK = 0,
	PARSE_NOT_IPV4,
	PARSE_MALFORMED,
};

struct packet {
	__u32 l3_off;		/* offset of the IPv4 header from the start of the frame */
	__u32 l4_off;		/* offset of the L4 header (l3_off + ihl * 4) */
	__be32 saddr;		/* network order */
	__be32 daddr;		/* network order */
	__be16 sport;		/* network order; ICMP echo: the identifier; else 0 */
	__be16 dport;		/* network order; ICMP echo: the identifier; else 0 */
	__u16 ip_len;		/* host order: IPv4 total length */
	__u8 proto;		/* IPPROTO_* */
	__u8 tcp_flags;		/* TCP_FLAG_* of a TCP packet; an SCTP packet's
				 * first chunk as such (sctp_seen_flags) */
	__u8 icmp_type;
	__u8 icmp_code;
	__u8 fragment;		/* 1 when MF is set or the fragment offset is not zero */
	__u8 ttl;
	__u8 l4_absent;		/* 1 for a non-first fragment: no L4 header in this
				 * packet; sport/dport come from the first fragment and
				 * rewrites touch the IP header only */
	__be16 ip_id;		/* network order: the IPv4 identification */
};

/* Make the first len bytes linear so direct packet access can see them. */
static __always_inline int pull(struct __sk_buff *skb, __u32 len)
{
	if ((void *)(long)skb->data + len <= (void *)(long)skb->data_end)
		return 0;
	if (skb->len < len)
		return -1;
	return bpf_skb_pull_data(skb, len);
}

/* has_ports: a protocol whose header leads with a source and a destination
 * port, which conntrack tracks and services balance. */
static __always_inline int has_ports(__u8 proto)
{
	return proto == IPPROTO_TCP || proto == IPPROTO_UDP || proto == IPPROTO_SCTP;
}

/* ports_of copies a TCP, UDP or SCTP header's ports, which lead each, as
 * one word: the conntrack key reads them so (ct_key_of). */
#define ports_of(p, l4) __builtin_memcpy(&(p)->sport, (l4), 4)

/* parse_sctp reads an SCTP packet's ports and its first chunk's type, when
 * it has a chunk (sctp.h). A subprogram, called only for SCTP: inline, its
 * registers would take stack slots in every entry program's frame, on
 * chains of calls that fill the stack's 512 bytes. */
__subprog int parse_sctp(struct __sk_buff *skb, struct packet *p)
{
	/* Bounded for the verifier, which knows nothing of p here: no
	 * header reaches this far (IPv6's extension headers stop at 2048). */
	__u32 l4_off = p->l4_off;
	if (l4_off > 4095)
		return PARSE_MALFORMED;
	int has_chunk = p->l3_off + p->ip_len >= l4_off + SCTP_COMMON_HLEN + 4;

	if (pull(skb, l4_off + SCTP_COMMON_HLEN + (has_chunk ? 4 : 0)))
		return PARSE_MALFORMED;
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	__u8 *sctp = data + l4_off;
	if ((void *)(sctp + SCTP_COMMON_HLEN) > data_end)
		return PARSE_MALFORMED;
	ports_of(p, sctp);
	if (!has_chunk)
		return PARSE_OK; /* the common header alone says nothing */
	if ((void *)(sctp + SCTP_COMMON_HLEN + 1) > data_end)
		return PARSE_MALFORMED;
	p->tcp_flags = sctp_seen_flags(sctp[SCTP_COMMON_HLEN]);
	return PARSE_OK;
}

static __always_inline int parse_l4(struct __sk_buff *skb, struct packet *p)
{
	void *data, *data_end;

	if (p->l4_absent)
		return PARSE_OK; /* the ports come from the first fragment (frag.h) */

	switch (p->proto) {
	case IPPROTO_TCP: {
		if (pull(skb, p->l4_off + sizeof(struct tcphdr)))
			return PARSE_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		struct tcphdr *tcp = data + p->l4_off;
		if ((void *)(tcp + 1) > data_end)
			return PARSE_MALFORMED;
		if (tcp->doff < 5)
			return PARSE_MALFORMED;
		ports_of(p, tcp);
		p->tcp_flags = ((__u8 *)tcp)[13];
		return PARSE_OK;
	}
	case IPPROTO_UDP: {
		if (pull(skb, p->l4_off + sizeof(struct udphdr)))
			return PARSE_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		struct udphdr *udp = data + p->l4_off;
		if ((void *)(udp + 1) > data_end)
			return PARSE_MALFORMED;
		ports_of(p, udp);
		return PARSE_OK;
	}
	case IPPROTO_SCTP:
		return parse_sctp(skb, p);
	case IPPROTO_ICMP: {
		if (pull(skb, p->l4_off + sizeof(struct icmphdr)))
			return PARSE_MALFORMED;
		data = (void *)(long)skb->data;
		data_end = (void *)(long)skb->data_end;
		struct icmphdr *icmp = data + p->l4_off;
		if ((void *)(icmp + 1) > data_end)
			return PARSE_MALFORMED;
		p->icmp_type = icmp->type;
		p->icmp_code = icmp->code;
		if (icmp->type == ICMP_ECHO || icmp->type == ICMP_ECHOREPLY) {
			p->sport = icmp->un.echo.id;
			p->dport = icmp->un.echo.id;
		}
		return PARSE_OK;
	}
	default:
		return PARSE_OK;
	}
}

/* parse_ipv4 reads the IPv4 header at p->l3_off: the one function here that
 * knows the address family's header. The IPv6 parser (ipv6.h) sits beside it
 * and hands over to the same parse_l4. */
static __always_inline int parse_ipv4(struct __sk_buff *skb, struct packet *p)
{
	if (pull(skb, p->l3_off + sizeof(struct iphdr)))
		return PARSE_MALFORMED;
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;

	struct iphdr *ip = data + p->l3_off;
	if ((void *)(ip + 1) > data_end)
		return PARSE_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;

	__u32 hdr_len = ip->ihl * 4;
	p->ip_len = bpf_ntohs(ip->tot_len);
	if (p->ip_len < hdr_len || skb->len < p->l3_off + p->ip_len)
		return PARSE_MALFORMED;

	p->l4_off = p->l3_off + hdr_len;
	p->saddr = ip->saddr;
	p->daddr = ip->daddr;
	p->proto = ip->protocol;
	p->ttl = ip->ttl;
	p->fragment = (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) != 0;
	p->l4_absent = (ip->frag_off & bpf_htons(IP_OFFSET)) != 0;
	p->ip_id = ip->id;
	return PARSE_OK;
}

/* parse_packet: the link layer, then the network header, then L4.
 * l2_len: ETH_HLEN or 0 (an L3 device), a constant at every call site. */
static __always_inline int parse_packet(struct __sk_buff *skb, struct packet *p, const __u32 l2_len)
{
	__builtin_memset(p, 0, sizeof(*p));
	if (skb->protocol != bpf_htons(ETH_P_IP))
		return PARSE_NOT_IPV4;

	p->l3_off = l2_len;
	if (l2_len) {
		if (pull(skb, ETH_HLEN))
			return PARSE_MALFORMED;
		struct ethhdr *eth = (void *)(long)skb->data;
		if ((void *)(eth + 1) > (void *)(long)skb->data_end)
			return PARSE_MALFORMED;
		if (eth->h_proto != bpf_htons(ETH_P_IP))
			return PARSE_NOT_IPV4;
	}
	int r = parse_ipv4(skb, p);
	if (r != PARSE_OK)
		return r;
	return parse_l4(skb, p);
}
