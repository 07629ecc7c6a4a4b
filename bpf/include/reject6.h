/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 answers the datapath makes itself, as reject.h does for IPv4: the TCP
 * RST and ICMPv6 port unreachable for a new flow to a Service without
 * endpoints (reject6), and echo replies from service IPs (answer_echo6),
 * each built in place from the packet it answers. */
#pragma once

#include "common.h"
#include "counters.h"
#include "csum.h"
#include "ipv6.h"
#include "reject.h"

/* The IPv6 pseudo header of an upper-layer checksum (RFC 8200 8.1). */
struct pseudo6 {
	__u8 saddr[16];
	__u8 daddr[16];
	__be32 len;
	__u8 zero[3];
	__u8 next;
};

static __always_inline void reply_ip6hdr(struct ip6_raw *ip, const struct packet6 *p6, __u8 next, __u16 payload)
{
	__builtin_memset(ip, 0, sizeof(*ip));
	ip->ver_tc_flow = bpf_htonl(6 << 28);
	ip->payload_len = bpf_htons(payload);
	ip->nexthdr = next;
	ip->hop_limit = 64;	/* Linux's default (net.ipv6.conf.*.hop_limit) */
	addr6_copy(ip->saddr, p6->daddr);
	addr6_copy(ip->daddr, p6->saddr);
}

static __always_inline __s64 pseudo6_sum(const struct packet6 *p6, __u8 next, __u32 len)
{
	struct pseudo6 ph = { .len = bpf_htonl(len), .next = next };

	addr6_copy(ph.saddr, p6->daddr);
	addr6_copy(ph.daddr, p6->saddr);
	return bpf_csum_diff(NULL, 0, (__be32 *)&ph, sizeof(ph), 0);
}

/* reject6_tcp: reject_tcp (reject.h). Extension headers are dropped: the
 * RST is built from scratch after the link layer. */
__subprog int reject6_tcp(struct __sk_buff *skb, const struct packet6 *p6)
{
	const struct packet *p = &p6->p;
	struct tcp_raw in, rst = {};
	struct ip6_raw ip;

	if (bpf_skb_load_bytes(skb, p->l4_off, &in, sizeof(in)))
		return -1;
	__u32 seg_len = p->ip_len - (p->l4_off - p->l3_off) - (in.doff_res >> 4) * 4;
	if (in.flags & TCP_FLAG_SYN)
		seg_len++;
	if (in.flags & TCP_FLAG_FIN)
		seg_len++;
	rst.source = in.dest;
	rst.dest = in.source;
	rst.doff_res = 5 << 4;	/* data offset: 5 words (no options) */
	if (in.flags & TCP_FLAG_ACK) {
		rst.seq = in.ack_seq;
		rst.flags = TCP_FLAG_RST;
	} else {
		rst.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + seg_len);
		rst.flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	}
	__s64 sum = pseudo6_sum(p6, IPPROTO_TCP, sizeof(rst));
	rst.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&rst, sizeof(rst), sum));
	reply_ip6hdr(&ip, p6, IPPROTO_TCP, sizeof(rst));

	if (bpf_skb_change_tail(skb, p->l3_off + sizeof(ip) + sizeof(rst), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + sizeof(ip), &rst, sizeof(rst), 0) ||
	    swap_macs(skb, p))
		return -1;
	return 0;
}

/* The ICMPv6 error quotes the IPv6 header, its extension headers and the
 * first 8 bytes after them: the UDP header, which is what the sender's stack
 * matches the error by (it walks the quoted extension headers as it walks a
 * received packet's). The first fragment of a datagram carries an 8-byte
 * fragment header; ICMP6_QUOTE_EXT bounds the extension headers a quote
 * takes. */
#define ICMP6_QUOTE_EXT 64
#define ICMP6_QUOTE_MAX (IPV6_HLEN + ICMP6_QUOTE_EXT + 8)

/* reject6_udp turns a datagram into the ICMPv6 port unreachable that
 * answers it. A datagram with more extension headers than a quote takes is
 * refused (the caller drops), as reject_udp refuses IPv4 options. */
__subprog int reject6_udp(struct __sk_buff *skb, const struct packet6 *p6)
{
	const struct packet *p = &p6->p;
	struct {
		struct ip6_raw ip;
		struct icmphdr icmp;
		__u8 quote[ICMP6_QUOTE_MAX];
	} reply = {};
	const __u32 grow = sizeof(reply.ip) + sizeof(reply.icmp);
	/* Extension headers are whole multiples of 8 bytes, so the quote's
	 * length stays a multiple of 4, as bpf_csum_diff requires. */
	__u32 ext = p->l4_off - p->l3_off - IPV6_HLEN;

	if (ext > ICMP6_QUOTE_EXT)
		return -1;
	__u32 quote_len = IPV6_HLEN + ext + 8;
	__u32 icmp_len = sizeof(reply.icmp) + quote_len;

	if (quote_len > sizeof(reply.quote) ||
	    bpf_skb_load_bytes(skb, p->l3_off, reply.quote, quote_len))
		return -1;
	reply.icmp.type = ICMPV6_DEST_UNREACH;
	reply.icmp.code = ICMPV6_PORT_UNREACH;
	reply.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&reply.icmp, icmp_len,
						      pseudo6_sum(p6, IPPROTO_ICMPV6, icmp_len)));
	reply_ip6hdr(&reply.ip, p6, IPPROTO_ICMPV6, icmp_len);

	if (bpf_skb_adjust_room(skb, grow, BPF_ADJ_ROOM_MAC, 0) ||
	    bpf_skb_change_tail(skb, p->l3_off + grow + quote_len, 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off, &reply, grow + quote_len, 0) ||
	    swap_macs(skb, p))
		return -1;
	return 0;
}

/* reject6 answers a new flow (to a Service without endpoints, or to an
 * undefined port of a ClusterIP: why counts which). Each answer is
 * a function of its own, so the stack holds one reply at a time: the
 * pipeline's frames and the UDP reply's quote fill most of the 512 bytes. */
static __always_inline int reject6(struct __sk_buff *skb, const struct packet6 *p6, enum counter why)
{
	int err = p6->p.proto == IPPROTO_TCP ? reject6_tcp(skb, p6) : reject6_udp(skb, p6);

	if (err)
		return drop(CNT_DROP_REJECT_FAILED);
	count(why);
	return bpf_redirect(skb->ifindex, 0);
}

/* answer_echo6 turns an echo request into its reply: the addresses swap
 * (the pseudo header's sum stays), the type changes from 128 to 129. */
static __always_inline int answer_echo6(struct __sk_buff *skb, const struct packet6 *p6)
{
	const struct packet *p = &p6->p;
	__u8 addrs[32];
	__u8 type = ICMPV6_ECHO_REPLY;

	addr6_copy(addrs, p6->daddr);
	addr6_copy(addrs + 16, p6->saddr);
	if (bpf_l4_csum_replace(skb, p->l4_off + offsetof(struct icmphdr, checksum),
				bpf_htons(ICMPV6_ECHO_REQUEST << 8), bpf_htons(ICMPV6_ECHO_REPLY << 8), 2) ||
	    bpf_skb_store_bytes(skb, p->l4_off, &type, 1, 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + IP6_SADDR_OFF, addrs, sizeof(addrs), 0) ||
	    swap_macs(skb, p))
		return -1;
	return 0;
}
