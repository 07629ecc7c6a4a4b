/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Forwarding by the FIB, and the path MTU it finds.
 *
 * A packet leaving a workload whose source has just become one of the node's
 * addresses (the reply of a NodePort flow to a local backend, a flow SNATed to
 * the node) is one the node's stack cannot answer for. Were it too big for
 * its egress link, the stack's "fragmentation needed" or Packet Too Big would
 * go to the packet's source, the node itself, match no socket and be lost;
 * the backend would resend full-size segments into a black hole and the
 * transfer would stall. So such packets meet the FIB here with their length
 * (a GSO packet's is that of its segments). One that does not fit becomes the
 * error the stack would have sent, addressed to the node, which
 * icmp_error_rnat then translates as it translates a router's error about a
 * reply: the quote becomes the packet as the backend sent it and the error
 * goes to the backend, on the interface the packet came from.
 *
 * IPv4 packets are then forwarded here (fib_forward). IPv6 ones go on to the
 * stack, which forwards a packet with a local source address. */
#pragma once

#include "common.h"
#include "counters.h"
#include "icmp_error.h"
#include "icmp_error6.h"
#include "ipv6.h"
#include "parse.h"
#include "reject.h"
#include "reject6.h"

/* FIB_TOO_BIG: fib_forward's "the packet does not fit its egress link",
 * the link's MTU in *mtu; the caller answers it (too_big). */
#define FIB_TOO_BIG 0x80000

#define IPV6_MIN_MTU 1280

/* segment_len is the length the FIB's MTU check must see: a GSO packet
 * leaves as segments of gso_size bytes after its headers. l4_off counts from
 * the IP header. */
static __always_inline __u32 segment_len(struct __sk_buff *skb, __u32 ip_len, __u32 l4_off, __u8 proto)
{
	__u32 l4_hdr = sizeof(struct udphdr);
	__u8 doff;

	if (!skb->gso_size)
		return ip_len;
	if (proto == IPPROTO_TCP) {
		if (bpf_skb_load_bytes(skb, ETH_HLEN + l4_off + 12, &doff, 1))
			return ip_len;
		l4_hdr = (doff >> 4) * 4;
	}
	return l4_off + l4_hdr + skb->gso_size;
}

/* fib_mtu6 looks an IPv6 packet's route up with its length: FIB_TOO_BIG
 * (and the MTU) when it does not fit, TC_ACT_OK otherwise. */
static __always_inline int fib_mtu6(struct __sk_buff *skb, __u32 *mtu)
{
	struct ip6_raw ip;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) ||
	    (ip.nexthdr != IPPROTO_TCP && ip.nexthdr != IPPROTO_UDP))
		return TC_ACT_OK;
	__u32 len = segment_len(skb, IPV6_HLEN + bpf_ntohs(ip.payload_len), IPV6_HLEN, ip.nexthdr);
	/* Every IPv6 link carries 1280 bytes (RFC 8200 5): most packets (ACKs,
	 * small answers) need no lookup. */
	if (len <= IPV6_MIN_MTU)
		return TC_ACT_OK;
	struct bpf_fib_lookup fib = {
		.family = 10, /* AF_INET6 */
		.l4_protocol = ip.nexthdr,
		.tot_len = len,
		.ifindex = skb->ifindex,
	};
	__builtin_memcpy(fib.ipv6_src, ip.saddr, 16);
	__builtin_memcpy(fib.ipv6_dst, ip.daddr, 16);
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_FRAG_NEEDED)
		return TC_ACT_OK;
	*mtu = fib.mtu_result;
	return FIB_TOO_BIG;
}

/* fib_forward forwards an IPv4 packet from a workload whose source has just
 * become one of the node's own addresses. The node's stack would drop it as
 * a spoof of its own address (a martian source), so it is routed here
 * instead: the kernel's FIB picks the interface and next hop for the packet's
 * (translated) addresses, the TTL goes down by one as the stack's forwarding
 * would, and the packet is redirected, resolving the next hop's MAC if the
 * neighbour table does not hold it. What the FIB does not forward (a local
 * destination, an expired TTL, no route) goes to the stack as before; what
 * does not fit its link is FIB_TOO_BIG. An IPv6 packet only has its length
 * checked (see above). A subprogram: the lookup's 64 bytes stay off the
 * stages' stack. Interfaces with an Ethernet header call it: a workload's,
 * and a data interface for external traffic SNATed to the node, which the
 * stack would drop as a martian too (its source is the node's own
 * address). */
__subprog int fib_forward(struct __sk_buff *skb, __u32 *mtu)
{
	struct iphdr ip;

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return fib_mtu6(skb, mtu);
	if (bpf_skb_load_bytes(skb, ETH_HLEN, &ip, sizeof(ip)) || ip.ttl <= 1)
		return TC_ACT_OK;
	struct bpf_fib_lookup fib = {
		.family = 2, /* AF_INET */
		.l4_protocol = ip.protocol,
		.tot_len = segment_len(skb, bpf_ntohs(ip.tot_len), ip.ihl * 4, ip.protocol),
		.ipv4_src = ip.saddr,
		.ipv4_dst = ip.daddr,
		.ifindex = skb->ifindex,
	};
	long rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc == BPF_FIB_LKUP_RET_FRAG_NEEDED && (ip.frag_off & bpf_htons(IP_DF))) {
		*mtu = fib.mtu_result;
		return FIB_TOO_BIG;
	}
	/* Too big without DF: the stack fragments it, as before. */
	if (rc != BPF_FIB_LKUP_RET_SUCCESS && rc != BPF_FIB_LKUP_RET_NO_NEIGH)
		return TC_ACT_OK;
	/* The TTL and the protocol share the checksum's 16-bit word. */
	__be16 old = bpf_htons((__u16)ip.ttl << 8), new = bpf_htons((__u16)(ip.ttl - 1) << 8);
	__u8 ttl = ip.ttl - 1;
	if (bpf_l3_csum_replace(skb, ETH_HLEN + offsetof(struct iphdr, check), old, new, sizeof(new)) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN + offsetof(struct iphdr, ttl), &ttl, 1, 0))
		return drop(CNT_DROP_MALFORMED);
	count(CNT_FIB_FORWARDED);
	if (rc == BPF_FIB_LKUP_RET_NO_NEIGH) {
		struct bpf_redir_neigh nh = { .nh_family = 2 /* AF_INET */, .ipv4_nh = fib.ipv4_dst };
		return bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0);
	}
	if (bpf_skb_store_bytes(skb, 0, fib.dmac, ETH_ALEN, 0) ||
	    bpf_skb_store_bytes(skb, ETH_ALEN, fib.smac, ETH_ALEN, 0))
		return drop(CNT_DROP_MALFORMED);
	return bpf_redirect(fib.ifindex, 0);
}

/* too_big4 turns a packet into the "fragmentation needed" that answers it,
 * from the node and to the node (its translated source), then translates
 * that back (see above). The quote is the packet's IP header and first 8
 * bytes, as the stack's would be. */
static __always_inline int too_big4(struct __sk_buff *skb, __u32 mtu)
{
	struct {
		struct iphdr ip;
		struct icmphdr icmp;
		__u8 quote[ICMP_QUOTE_LEN];
	} err = {};
	struct iphdr *in = (struct iphdr *)err.quote;

	if (bpf_skb_load_bytes(skb, ETH_HLEN, err.quote, sizeof(err.quote)))
		return -1;
	struct packet p = {
		.l3_off = ETH_HLEN, .l4_off = ETH_HLEN + sizeof(struct iphdr),
		.saddr = in->saddr, .daddr = in->saddr, .proto = IPPROTO_ICMP,
	};
	err.icmp.type = ICMP_DEST_UNREACH;
	err.icmp.code = ICMP_FRAG_NEEDED;
	err.icmp.un.frag.mtu = bpf_htons(mtu);
	err.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&err.icmp,
						    sizeof(err.icmp) + sizeof(err.quote), 0));
	reply_iphdr(&err.ip, &p, IPPROTO_ICMP, sizeof(err));
	__be32 to;
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(err), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &err, sizeof(err), 0) ||
	    icmp_error_rnat(skb, &p) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + IP_DADDR_OFF, &to, sizeof(to)))
		return -1;
	/* Still to the node: the packet was of no flow the datapath NATed. */
	return to == p.daddr ? -1 : 0;
}

/* too_big6 is too_big4 for IPv6: a Packet Too Big, quoting the IPv6 header
 * and 8 bytes (the packets met here carry no extension headers: fib_mtu6). */
static __always_inline int too_big6(struct __sk_buff *skb, __u32 mtu)
{
	struct {
		struct ip6_raw ip;
		struct icmphdr icmp;
		__u8 quote[IPV6_HLEN + 8];
	} err = {};
	struct packet6 p6 = {
		.p = { .l3_off = ETH_HLEN, .l4_off = ETH_HLEN + IPV6_HLEN, .proto = IPPROTO_ICMPV6 },
	};
	const __u32 icmp_len = sizeof(err.icmp) + sizeof(err.quote);

	if (bpf_skb_load_bytes(skb, ETH_HLEN, err.quote, sizeof(err.quote)))
		return -1;
	addr6_copy(p6.saddr, ((struct ip6_raw *)err.quote)->saddr);
	addr6_copy(p6.daddr, p6.saddr);
	err.icmp.type = ICMPV6_PKT_TOOBIG;
	err.icmp.un.gateway = bpf_htonl(mtu);
	err.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&err.icmp, icmp_len,
						    pseudo6_sum(&p6, IPPROTO_ICMPV6, icmp_len)));
	reply_ip6hdr(&err.ip, &p6, IPPROTO_ICMPV6, icmp_len);
	__u8 to[16];
	if (bpf_skb_change_tail(skb, ETH_HLEN + sizeof(err), 0) ||
	    bpf_skb_store_bytes(skb, ETH_HLEN, &err, sizeof(err), 0) ||
	    icmp6_error_rnat(skb, &p6) ||
	    bpf_skb_load_bytes(skb, ETH_HLEN + IP6_DADDR_OFF, to, sizeof(to)))
		return -1;
	return addr6_eq(to, p6.daddr) ? -1 : 0;
}

/* too_big answers a packet FIB_TOO_BIG refused: the error goes back out of
 * the interface the packet came in by, to the workload that sent it. A
 * subprogram, called from the entry program's frame: icmp6_error_rnat's
 * frame adds to it. */
__subprog int too_big(struct __sk_buff *skb, __u32 mtu)
{
	int err = skb->protocol == bpf_htons(ETH_P_IPV6) ? too_big6(skb, mtu) : too_big4(skb, mtu);

	if (err || swap_eth(skb))
		return drop(CNT_DROP_REJECT_FAILED);
	return bpf_redirect(skb->ifindex, 0);
}

/* forward_by_fib carries out FORWARD_BY_FIB. */
static __always_inline int forward_by_fib(struct __sk_buff *skb)
{
	__u32 mtu = 0;
	int verdict = fib_forward(skb, &mtu);

	return verdict == FIB_TOO_BIG ? too_big(skb, mtu) : verdict;
}
