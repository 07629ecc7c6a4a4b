/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* ICMPv6 errors about NATed flows translated back, as icmp_error.h does for
 * IPv4: the quoted packet becomes the one its sender sent, and the error
 * goes to it (Packet Too Big first: IPv6 routers never fragment, so path-MTU
 * discovery must work through the proxy). */
#pragma once

#include "common.h"
#include "conntrack6.h"
#include "counters.h"
#include "csum.h"
#include "ipv6.h"
#include "reject6.h"
#include "rewrite6.h"

/* quote6_rewrite rewrites an address and a port of the packet an ICMPv6
 * error quotes. The quoted IPv6 header has no checksum; both changes go into
 * the ICMPv6 checksum, which covers the quote. */
static __always_inline int quote6_rewrite(struct __sk_buff *skb, __u32 icmp_csum_off, __u32 quote_off,
					  __u32 addr_off, const __u8 *old_addr, const __u8 *new_addr,
					  __u32 port_off, __be16 old_port, __be16 new_port)
{
	if (!addr6_eq(old_addr, new_addr)) {
		__s64 diff = bpf_csum_diff((__be32 *)old_addr, 16, (__be32 *)new_addr, 16, 0);
		if (diff < 0 || bpf_l4_csum_replace(skb, icmp_csum_off, 0, diff, 0) ||
		    bpf_skb_store_bytes(skb, quote_off + addr_off, new_addr, 16, 0))
			return -1;
	}
	if (old_port != new_port &&
	    (bpf_l4_csum_replace(skb, icmp_csum_off, old_port, new_port, sizeof(new_port)) ||
	     bpf_skb_store_bytes(skb, quote_off + IPV6_HLEN + port_off, &new_port, sizeof(new_port), 0)))
		return -1;
	return 0;
}

/* icmp6_error_rnat: icmp_error_rnat (icmp_error.h) for destination
 * unreachable, packet too big and time exceeded, about either direction of
 * a NATed flow. A quote whose next header is not TCP or UDP is not about one
 * of the datapath's flows. Returns 0 when translated or not about a NATed
 * flow, -1 when a rewrite failed. */
__subprog int icmp6_error_rnat(struct __sk_buff *skb, struct packet6 *p6)
{
	struct packet *p = &p6->p;
	__u32 quote_off = p->l4_off + sizeof(struct icmphdr);
	__u32 icmp_csum_off = p->l4_off + offsetof(struct icmphdr, checksum);
	struct ip6_raw q;
	__be16 qports[2];

	if (bpf_skb_load_bytes(skb, quote_off, &q, sizeof(q)) ||
	    bpf_skb_load_bytes(skb, quote_off + sizeof(q), qports, sizeof(qports)))
		return 0;
	if (q.nexthdr != IPPROTO_TCP && q.nexthdr != IPPROTO_UDP)
		return 0;

	/* The key in the scratch map: this frame is the last of one of the
	 * verifier's deepest chains (pipeline6, handle_icmp6, here). */
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &sl_slot0);
	if (!sc)
		return 0;
	struct ct6_key *key = &sc->rev_key;
	__builtin_memset(key, 0, sizeof(*key));
	key->sport = qports[1];
	key->dport = qports[0];
	key->proto = q.nexthdr;
	addr6_copy(key->saddr, q.daddr);
	addr6_copy(key->daddr, q.saddr);
	struct ct6_value *v = bpf_map_lookup_elem(&sl_ct6_v1, key);
	if (!v)
		return 0;

	if (v->type == CT_REVERSE) {
		/* About a packet toward the backend, from its side of the path:
		 * the quote becomes the packet the client sent. */
		if (quote6_rewrite(skb, icmp_csum_off, quote_off, IP6_DADDR_OFF, q.daddr, v->nat_addr,
				   2, qports[1], v->nat_port))
			return -1;
		if (v->flags & CT_SNAT) {
			if (quote6_rewrite(skb, icmp_csum_off, quote_off, IP6_SADDR_OFF, q.saddr, v->snat_addr,
					   0, qports[0], v->snat_port) ||
			    rewrite_addr6(skb, p, IP6_DADDR_OFF, p6->daddr, v->snat_addr, 1))
				return -1;
		}
		if (addr6_eq(p6->saddr, q.daddr) && rewrite_addr6(skb, p, IP6_SADDR_OFF, p6->saddr, v->nat_addr, 1))
			return -1;
	} else {
		/* About a reply, on its way to the client (a router toward an
		 * external client whose path has a smaller MTU sends Packet Too
		 * Big to the service address): the quote becomes the reply as
		 * the backend sent it, and the error goes to the backend, so its
		 * stack lowers the path MTU. Without this a NodePort's large
		 * replies would stall on such a path. */
		if (quote6_rewrite(skb, icmp_csum_off, quote_off, IP6_SADDR_OFF, q.saddr, v->nat_addr,
				   0, qports[0], v->nat_port))
			return -1;
		if ((v->flags & CT_SNAT) &&
		    quote6_rewrite(skb, icmp_csum_off, quote_off, IP6_DADDR_OFF, q.daddr, v->snat_addr,
				   2, qports[1], v->snat_port))
			return -1;
		if (rewrite_addr6(skb, p, IP6_DADDR_OFF, p6->daddr, v->nat_addr, 1))
			return -1;
	}
	count(CNT_ICMP_ERROR_TRANSLATED);
	return 0;
}
