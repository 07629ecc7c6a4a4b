/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Replies the datapath sends itself, back out of the interface the packet came
 * in on: TCP RST and ICMP port unreachable for a Service without endpoints, and
 * echo replies for service IPs. The packet is rewritten in place (addresses and
 * MACs swapped; an L3 device has no MACs) and redirected, so nothing is
 * allocated. */
#pragma once

#include "common.h"
#include "csum.h"
#include "parse.h"
#include "rewrite.h"

/* The TCP header without bitfields. */
struct tcp_raw {
	__be16 source;
	__be16 dest;
	__be32 seq;
	__be32 ack_seq;
	__u8 doff_res;		/* data offset in the high nibble */
	__u8 flags;		/* TCP_FLAG_* */
	__be16 window;
	__sum16 check;
	__be16 urg_ptr;
};

/* An L3 device's packets have no link-layer header (l3_off 0): nothing to swap. */
static __always_inline int swap_macs(struct __sk_buff *skb, const struct packet *p)
{
	return p->l3_off ? swap_eth(skb) : 0;
}

static __always_inline void reply_iphdr(struct iphdr *ip, const struct packet *p, __u8 proto, __u16 len)
{
	__builtin_memset(ip, 0, sizeof(*ip));
	ip->version = 4;
	ip->ihl = 5;		/* 20 bytes: no options */
	ip->tot_len = bpf_htons(len);
	ip->ttl = 64;		/* Linux's default (net.ipv4.ip_default_ttl) */
	ip->protocol = proto;
	ip->saddr = p->daddr;
	ip->daddr = p->saddr;
	ip->check = ipv4_hdr_csum(ip);
}

/* reject_tcp turns a segment into the RST that answers it (RFC 9293 3.10.7.1). */
static __always_inline int reject_tcp(struct __sk_buff *skb, const struct packet *p)
{
	struct tcp_raw in, rst = {};
	struct {
		__be32 saddr, daddr;
		__u8 zero, proto;
		__be16 len;
	} pseudo = { .saddr = p->daddr, .daddr = p->saddr, .proto = IPPROTO_TCP,
		     .len = bpf_htons(sizeof(rst)) };
	struct iphdr ip;

	if (p->l4_off != p->l3_off + sizeof(struct iphdr))
		return -1;	/* IP options: not reflected, the caller drops */
	if (bpf_skb_load_bytes(skb, p->l4_off, &in, sizeof(in)))
		return -1;

	__u32 seg_len = p->ip_len - sizeof(struct iphdr) - (in.doff_res >> 4) * 4;
	if (in.flags & TCP_FLAG_SYN)
		seg_len++;
	if (in.flags & TCP_FLAG_FIN)
		seg_len++;
	rst.source = in.dest;
	rst.dest = in.source;
	rst.doff_res = 5 << 4;	/* data offset: 5 words (no options), in the high nibble */
	if (in.flags & TCP_FLAG_ACK) {
		rst.seq = in.ack_seq;
		rst.flags = TCP_FLAG_RST;
	} else {
		rst.ack_seq = bpf_htonl(bpf_ntohl(in.seq) + seg_len);
		rst.flags = TCP_FLAG_RST | TCP_FLAG_ACK;
	}
	__s64 sum = bpf_csum_diff(NULL, 0, (__be32 *)&pseudo, sizeof(pseudo), 0);
	sum = bpf_csum_diff(NULL, 0, (__be32 *)&rst, sizeof(rst), sum);
	rst.check = csum_fold(sum);
	reply_iphdr(&ip, p, IPPROTO_TCP, sizeof(ip) + sizeof(rst));

	if (bpf_skb_change_tail(skb, p->l3_off + sizeof(ip) + sizeof(rst), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off, &ip, sizeof(ip), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + sizeof(ip), &rst, sizeof(rst), 0) ||
	    swap_macs(skb, p))
		return -1;
	return 0;
}

/* ICMP errors quote the offending IP header and the first 8 bytes after it. */
#define ICMP_QUOTE_LEN (sizeof(struct iphdr) + 8)

/* reject_udp turns a datagram into the ICMP port unreachable that answers it. */
static __always_inline int reject_udp(struct __sk_buff *skb, const struct packet *p)
{
	struct {
		struct iphdr ip;
		struct icmphdr icmp;
		__u8 quote[ICMP_QUOTE_LEN];
	} reply = {};
	const __u32 grow = sizeof(reply.ip) + sizeof(reply.icmp);

	if (p->l4_off != p->l3_off + sizeof(struct iphdr))
		return -1;	/* IP options: not quoted, the caller drops */
	if (bpf_skb_load_bytes(skb, p->l3_off, reply.quote, sizeof(reply.quote)))
		return -1;
	reply.icmp.type = ICMP_DEST_UNREACH;
	reply.icmp.code = ICMP_PORT_UNREACH;
	reply.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&reply.icmp,
						      sizeof(reply.icmp) + sizeof(reply.quote), 0));
	reply_iphdr(&reply.ip, p, IPPROTO_ICMP, sizeof(reply));

	/* Room for the new IP and ICMP headers in front of the quoted ones, then cut
	 * everything after the quote. */
	if (bpf_skb_adjust_room(skb, grow, BPF_ADJ_ROOM_MAC, 0) ||
	    bpf_skb_change_tail(skb, p->l3_off + sizeof(reply), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off, &reply, sizeof(reply), 0) ||
	    swap_macs(skb, p))
		return -1;
	return 0;
}

/* answer_echo turns an echo request into its reply. Swapping the addresses keeps
 * the IP checksum; the ICMP checksum changes by the type byte only. */
static __always_inline int answer_echo(struct __sk_buff *skb, const struct packet *p)
{
	__be32 addrs[2] = { p->daddr, p->saddr };
	__u8 type = ICMP_ECHOREPLY;

	/* The type is the high byte of the checksummed 16-bit word type|code. */
	if (bpf_l4_csum_replace(skb, p->l4_off + offsetof(struct icmphdr, checksum),
				bpf_htons(ICMP_ECHO << 8), bpf_htons(ICMP_ECHOREPLY << 8), 2) ||
	    bpf_skb_store_bytes(skb, p->l4_off, &type, 1, 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off + IP_SADDR_OFF, addrs, sizeof(addrs), 0) ||
	    swap_macs(skb, p))
		return -1;
	return 0;
}
