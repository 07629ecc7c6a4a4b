/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Reverse translation of ICMP errors (destination unreachable, including
 * fragmentation needed, and time exceeded) about a NATed flow, so that path-MTU
 * discovery and "connection refused" work through the proxy.
 *
 * An error about the flow's forward direction quotes the packet as the backend
 * saw it (client or node IP -> backend). The quote's reversed tuple is the
 * flow's reverse conntrack key; with it the quoted destination becomes the
 * frontend again, a SNATed quoted source becomes the client, the outer
 * destination becomes the client, and an outer source that is the backend
 * itself becomes the frontend (a router's address is kept).
 *
 * An error about a reply quotes it as it left the node (frontend -> client),
 * sent back to the frontend's address by a router on the client's path (a
 * smaller MTU there: fragmentation needed). Its reversed tuple is the flow's
 * forward key; the quote becomes the reply as the backend sent it (backend ->
 * client, or -> the node's SNAT address and port), and the outer destination
 * the backend, which the node then forwards it to, so the backend's stack
 * lowers its path MTU instead of resending into a black hole.
 *
 * Checksums: the quoted IP header's checksum is updated with its addresses, so
 * that header's sum, and with it the ICMP checksum, stay the same; quoted port
 * changes are folded into the ICMP checksum. The quoted L4 checksum is left as
 * it was: only 8 bytes of the segment are quoted and receivers do not check it. */
#pragma once

#include "common.h"
#include "conntrack.h"
#include "counters.h"
#include "parse.h"
#include "rewrite.h"

static __always_inline int quote_rewrite(struct __sk_buff *skb, __u32 icmp_csum_off, __u32 quote_off,
					 __u32 addr_off, __be32 old_addr, __be32 new_addr,
					 __u32 port_off, __be16 old_port, __be16 new_port)
{
	if (old_addr != new_addr &&
	    (bpf_l3_csum_replace(skb, quote_off + IP_CSUM_OFF, old_addr, new_addr, sizeof(new_addr)) ||
	     bpf_skb_store_bytes(skb, quote_off + addr_off, &new_addr, sizeof(new_addr), 0)))
		return -1;
	if (old_port != new_port &&
	    (bpf_l4_csum_replace(skb, icmp_csum_off, old_port, new_port, sizeof(new_port)) ||
	     bpf_skb_store_bytes(skb, quote_off + sizeof(struct iphdr) + port_off, &new_port, sizeof(new_port), 0)))
		return -1;
	return 0;
}

/* icmp_error_rnat returns 0 when the packet was translated or is not about a
 * NATed flow, -1 when a rewrite failed. */
static __always_inline int icmp_error_rnat(struct __sk_buff *skb, const struct packet *p)
{
	__u32 quote_off = p->l4_off + sizeof(struct icmphdr);
	__u32 icmp_csum_off = p->l4_off + offsetof(struct icmphdr, checksum);
	struct iphdr q;
	__be16 qports[2];

	if (bpf_skb_load_bytes(skb, quote_off, &q, sizeof(q)) ||
	    bpf_skb_load_bytes(skb, quote_off + sizeof(q), qports, sizeof(qports)))
		return 0;	/* quote too short to be about any flow */
	/* A quoted header with options (ihl above 5 words) would move the quoted
	 * ports; the datapath's own flows never carry options, so such a quote
	 * is not about one of them. */
	if (q.ihl != 5 || (q.protocol != IPPROTO_TCP && q.protocol != IPPROTO_UDP))
		return 0;

	struct ct_key key = {
		.saddr = q.daddr, .daddr = q.saddr,
		.sport = qports[1], .dport = qports[0],
		.proto = q.protocol,
	};
	struct ct_value *v = bpf_map_lookup_elem(&sl_ct_v2, &key);
	if (!v)
		return 0;

	if (v->type == CT_FORWARD) {
		/* About a reply: see the header comment. */
		if (quote_rewrite(skb, icmp_csum_off, quote_off, IP_SADDR_OFF, q.saddr, v->nat_addr,
				  0, qports[0], v->nat_port))
			return -1;
		if ((v->flags & CT_SNAT) &&
		    quote_rewrite(skb, icmp_csum_off, quote_off, IP_DADDR_OFF, q.daddr, v->snat_addr,
				  2, qports[1], v->snat_port))
			return -1;
		if (rewrite_addr_l3(skb, p, IP_DADDR_OFF, p->daddr, v->nat_addr))
			return -1;
		count(CNT_ICMP_ERROR_TRANSLATED);
		return 0;
	}

	/* The quote is the packet the node sent: its destination (port at
	 * offset 2 of the quoted L4 header) becomes the frontend again. */
	if (quote_rewrite(skb, icmp_csum_off, quote_off, IP_DADDR_OFF, q.daddr, v->nat_addr,
			  2, qports[1], v->nat_port))
		return -1;
	if (v->flags & CT_SNAT) {
		/* ... and its source (port at offset 0) the client again. */
		if (quote_rewrite(skb, icmp_csum_off, quote_off, IP_SADDR_OFF, q.saddr, v->snat_addr,
				  0, qports[0], v->snat_port) ||
		    rewrite_addr_l3(skb, p, IP_DADDR_OFF, p->daddr, v->snat_addr))
			return -1;
	}
	if (p->saddr == q.daddr && rewrite_addr_l3(skb, p, IP_SADDR_OFF, p->saddr, v->nat_addr))
		return -1;
	count(CNT_ICMP_ERROR_TRANSLATED);
	return 0;
}
