/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Rewriting addresses and ports with incremental checksum updates. Every write
 * goes through skb helpers by offset, so it is safe whatever the packet layout.
 * A non-first fragment (l4_absent) has no L4 header: only its IP header is
 * rewritten (rewrite_addr_l3); the first fragment carries the datagram's L4
 * checksum and ports. */
#pragma once

#include "common.h"
#include "parse.h"

#define IP_CSUM_OFF		offsetof(struct iphdr, check)
#define IP_SADDR_OFF		offsetof(struct iphdr, saddr)
#define IP_DADDR_OFF		offsetof(struct iphdr, daddr)

static __always_inline __u32 l4_csum_off(const struct packet *p)
{
	return p->l4_off + (p->proto == IPPROTO_TCP ? offsetof(struct tcphdr, check)
						    : offsetof(struct udphdr, check));
}

/* L4 checksum flags: addresses are part of the pseudo header; a UDP checksum of
 * 0 means "none" and must stay 0, and a computed 0 must be sent as 0xffff. */
static __always_inline __u64 l4_csum_flags(const struct packet *p, int pseudo)
{
	__u64 f = pseudo ? BPF_F_PSEUDO_HDR : 0;

	if (p->proto == IPPROTO_UDP)
		f |= BPF_F_MARK_MANGLED_0;
	return f;
}

/* rewrite_addr_l3 rewrites an address of the IP header alone: an ICMP
 * error's outer header, or a non-first fragment. */
static __always_inline int rewrite_addr_l3(struct __sk_buff *skb, const struct packet *p,
					   __u32 field_off, __be32 old, __be32 new)
{
	if (old == new)
		return 0;
	if (bpf_l3_csum_replace(skb, p->l3_off + IP_CSUM_OFF, old, new, sizeof(new)))
		return -1;
	return bpf_skb_store_bytes(skb, p->l3_off + field_off, &new, sizeof(new), 0);
}

static __always_inline int rewrite_addr(struct __sk_buff *skb, const struct packet *p,
					__u32 field_off, __be32 old, __be32 new)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, l4_csum_off(p), old, new, l4_csum_flags(p, 1) | sizeof(new)))
		return -1;
	if (bpf_l3_csum_replace(skb, p->l3_off + IP_CSUM_OFF, old, new, sizeof(new)))
		return -1;
	return bpf_skb_store_bytes(skb, p->l3_off + field_off, &new, sizeof(new), 0);
}

/* port_off: 0 for the source port, 2 for the destination port. */
static __always_inline int rewrite_port(struct __sk_buff *skb, const struct packet *p,
					__u32 port_off, __be16 old, __be16 new)
{
	if (old == new)
		return 0;
	if (bpf_l4_csum_replace(skb, l4_csum_off(p), old, new, l4_csum_flags(p, 0) | sizeof(new)))
		return -1;
	return bpf_skb_store_bytes(skb, p->l4_off + port_off, &new, sizeof(new), 0);
}

static __always_inline int rewrite_dst(struct __sk_buff *skb, struct packet *p, __be32 addr, __be16 port)
{
	if (rewrite_addr(skb, p, IP_DADDR_OFF, p->daddr, addr) ||
	    rewrite_port(skb, p, 2, p->dport, port))
		return -1;
	p->daddr = addr;
	p->dport = port;
	return 0;
}

static __always_inline int rewrite_src(struct __sk_buff *skb, struct packet *p, __be32 addr, __be16 port)
{
	if (rewrite_addr(skb, p, IP_SADDR_OFF, p->saddr, addr) ||
	    rewrite_port(skb, p, 0, p->sport, port))
		return -1;
	p->saddr = addr;
	p->sport = port;
	return 0;
}
