/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* IPv6 rewriting: rewrite.h's translation with 16-byte addresses. IPv6 has
 * no header checksum; an address change reaches the L4 checksum through its
 * pseudo header (TCP, UDP and ICMPv6 alike), as a difference computed once
 * over the 16 bytes. Port rewrites are rewrite.h's own. */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack6.h"
#include "ifstate.h"
#include "ipv6.h"
#include "rewrite.h"
#include "service6.h"

static __always_inline __u32 l4_csum_off6(const struct packet *p)
{
	if (p->proto == IPPROTO_TCP)
		return p->l4_off + offsetof(struct tcphdr, check);
	if (p->proto == IPPROTO_UDP)
		return p->l4_off + offsetof(struct udphdr, check);
	return p->l4_off + offsetof(struct icmphdr, checksum); /* ICMPv6 */
}

/* rewrite_addr6 writes an address of the IPv6 header at field_off; with
 * l4 set, the L4 checksum's pseudo header follows (a non-first fragment has
 * no L4 header: its datagram's checksum is in the first fragment). */
static __always_inline int rewrite_addr6(struct __sk_buff *skb, const struct packet *p, __u32 field_off,
					 const __u8 *old, const __u8 *new, int l4)
{
	if (addr6_eq(old, new))
		return 0;
	if (p->proto == IPPROTO_SCTP) /* no pseudo header (sctp.h); skb->csum follows */
		return bpf_skb_store_bytes(skb, p->l3_off + field_off, new, 16, BPF_F_RECOMPUTE_CSUM);
	if (l4) {
		__s64 diff = bpf_csum_diff((__be32 *)old, 16, (__be32 *)new, 16, 0);
		if (diff < 0 ||
		    bpf_l4_csum_replace(skb, l4_csum_off6(p), 0, diff,
					BPF_F_PSEUDO_HDR | (p->proto == IPPROTO_UDP ? BPF_F_MARK_MANGLED_0 : 0)))
			return -1;
	}
	return bpf_skb_store_bytes(skb, p->l3_off + field_off, new, 16, 0);
}

/* rewrite_port6: rewrite_port (rewrite.h), and SCTP's with its CRC
 * (sctp_rewrite_ports): the port's half of the ports' word, by a shift (an
 * indexed store compiles to address arithmetic the verifier refuses). */
static __always_inline int rewrite_port6(struct __sk_buff *skb, const struct packet *p, __u32 port_off, __be16 old,
					 __be16 new)
{
	if (p->proto == IPPROTO_SCTP)
		return old == new ? 0 : sctp_rewrite_ports(skb, p, ((__u32)old ^ (__u32)new) << (port_off ? 16 : 0));
	return rewrite_port(skb, p, port_off, old, new);
}

static __always_inline int rewrite_dst6(struct __sk_buff *skb, struct packet6 *p6, const __u8 *addr, __be16 port)
{
	struct packet *p = &p6->p;

	if (rewrite_addr6(skb, p, IP6_DADDR_OFF, p6->daddr, addr, !p->l4_absent))
		return -1;
	if (!p->l4_absent && rewrite_port6(skb, p, 2 /* dest: offset 2 */, p->dport, port))
		return -1;
	addr6_copy(p6->daddr, addr);
	p->dport = port;
	return 0;
}

static __always_inline int rewrite_src6(struct __sk_buff *skb, struct packet6 *p6, const __u8 *addr, __be16 port)
{
	struct packet *p = &p6->p;

	if (rewrite_addr6(skb, p, IP6_SADDR_OFF, p6->saddr, addr, !p->l4_absent))
		return -1;
	if (!p->l4_absent && rewrite_port6(skb, p, 0, p->sport, port))
		return -1;
	addr6_copy(p6->saddr, addr);
	p->sport = port;
	return 0;
}

/* ct6_apply_helpers: a translation a field at a time, by the helpers: for
 * a packet with extension headers, a non-first fragment (its ports are not
 * in it; rewrite_*6 skip them), CHECKSUM_COMPLETE, and SCTP (its CRC,
 * sctp.h). */
static __always_inline int ct6_apply_helpers(struct __sk_buff *skb, struct packet6 *p6, const struct ct6_value *v)
{
	if (v->type == CT_FORWARD) {
		if (rewrite_dst6(skb, p6, v->nat_addr, v->nat_port))
			return -1;
		if (v->flags & CT_SNAT)
			return rewrite_src6(skb, p6, v->snat_addr, v->snat_port);
		return 0;
	}
	if (rewrite_src6(skb, p6, v->nat_addr, v->nat_port))
		return -1;
	if (v->flags & CT_SNAT)
		return rewrite_dst6(skb, p6, v->snat_addr, v->snat_port);
	return 0;
}

/* nat6_span: rewrite_tuple's nat_span (rewrite.h) for IPv6: the bytes from
 * the source address to the end of the L4 checksum, 50 for TCP and 40 for
 * UDP, as 16-bit words: [0..7] the source, [8..15] the destination,
 * [16..17] the ports, then the L4 header up to its checksum. */
struct nat6_span {
	__u16 w[25];
	/* For a write deferred to sl_write_span, as nat_span's. */
	__u8 l3_off;
	__u8 len;
	__u16 unused[2];
} __attribute__((aligned(8)));
_Static_assert(sizeof(struct nat6_span) == 56, "nat6_span: the span and where it goes, in 56 bytes");
#define NAT6_SPAN_TCP	50
#define NAT6_SPAN_UDP	40

/* A CPU's IPv6 span handed to sl_write_span (ct6_apply with defer): the
 * IPv4 one's twin (sl_span_v1, rewrite.h). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nat6_span);
} sl_span6_v1 SEC(".maps");

/* addr6_diff: word_diff (rewrite.h) over a 16-byte address. */
static __always_inline __u64 addr6_diff(const __u16 *old, const __u8 *new)
{
	__u32 o[4], n[4];

	__builtin_memcpy(o, old, 16);
	__builtin_memcpy(n, new, 16);
	return word_diff(o[0], n[0]) + word_diff(o[1], n[1]) + word_diff(o[2], n[2]) + word_diff(o[3], n[3]);
}

/* ct6_apply: ct_apply (rewrite.h) for IPv6, in one store as rewrite_tuple
 * writes IPv4: IPv6 has no header checksum, and with no extension headers
 * both addresses, the ports and the L4 checksum lie in one run of bytes.
 * Where a field at a time took five helper calls (a destination: the
 * address's checksum difference, its checksum update and store, the port's
 * update and store), it takes one. */
static __always_inline int ct6_apply(struct __sk_buff *skb, struct packet6 *p6, const struct ct6_value *v, int defer)
{
	struct packet *p = &p6->p;

	if (p->l4_absent || p->l4_off - p->l3_off != IPV6_HLEN || p->proto == IPPROTO_SCTP)
		return ct6_apply_helpers(skb, p6, v);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *from = data + (p->l3_off & 0xff) + IP6_SADDR_OFF;
	struct nat6_span span = {};
	__u32 check_word;
	if (p->proto == IPPROTO_TCP) {
		if (from + NAT6_SPAN_TCP > data_end)
			return -1;
		span_load(&span, from, NAT6_SPAN_TCP);
		check_word = NAT6_SPAN_TCP / 2 - 1;
	} else {
		if (from + NAT6_SPAN_UDP > data_end)
			return -1;
		span_load(&span, from, NAT6_SPAN_UDP);
		check_word = NAT6_SPAN_UDP / 2 - 1;
	}
	/* The forward direction's destination and a reply's source are the
	 * translation's; the other side only with SNAT. */
	int fwd = v->type == CT_FORWARD, snat = v->flags & CT_SNAT;
	__u32 nat_word = fwd ? 8 : 0, other_word = fwd ? 0 : 8;
	__u32 nat_port = fwd ? 17 : 16, other_port = fwd ? 16 : 17;
	if (addr6_eq((const __u8 *)&span.w[nat_word & 8], v->nat_addr) && span.w[nat_port & 17] == v->nat_port &&
	    (!snat || (addr6_eq((const __u8 *)&span.w[other_word & 8], v->snat_addr) &&
		       span.w[other_port & 17] == v->snat_port)))
		return 0; /* a tracked flow that is not translated */
	__u64 addrs = addr6_diff(&span.w[nat_word & 8], v->nat_addr);
	__u64 ports = word_diff(span.w[nat_port & 17], v->nat_port);
	if (snat) {
		addrs += addr6_diff(&span.w[other_word & 8], v->snat_addr);
		ports += word_diff(span.w[other_port & 17], v->snat_port);
	}
	__u16 l4_check = span.w[check_word];
	__u32 checks = l4_check_updated(l4_check, SKB_CHECKSUM_PARTIAL, p->proto, addrs, 0) |
		       (__u32)l4_check_updated(l4_check, SKB_CHECKSUM_NONE, p->proto, addrs, ports) << 16;
	__builtin_memcpy(&span.w[nat_word & 8], v->nat_addr, 16);
	span.w[nat_port & 17] = v->nat_port;
	if (snat) {
		__builtin_memcpy(&span.w[other_word & 8], v->snat_addr, 16);
		span.w[other_port & 17] = v->snat_port;
	}

	enum skb_csum csum = skb_csum(skb);
	if (csum == SKB_CHECKSUM_COMPLETE)
		return ct6_apply_helpers(skb, p6, v);
	__u32 len = p->proto == IPPROTO_TCP ? NAT6_SPAN_TCP : NAT6_SPAN_UDP;
	span.w[len / 2 - 1] = csum == SKB_CHECKSUM_PARTIAL ? (__u16)checks : (__u16)(checks >> 16);
	if (defer) {
		/* The store is sl_write_span's (rewrite.h): the span goes to
		 * where it finds it. Nothing after reads the packet's tuple. */
		struct nat6_span *to = bpf_map_lookup_elem(&sl_span6_v1, &sl_slot0);
		if (!to)
			return -1;
		span.l3_off = p->l3_off;
		span.len = len;
		*to = span;
		return SPAN_DEFERRED;
	}
	if (bpf_skb_store_bytes(skb, p->l3_off + IP6_SADDR_OFF, &span, len, 0))
		return -1;
	__builtin_memcpy(p6->saddr, &span.w[0], 16);
	__builtin_memcpy(p6->daddr, &span.w[8], 16);
	p->sport = span.w[16];
	p->dport = span.w[17];
	return 0;
}

/* span6_write_direct: span_write_direct (rewrite.h) for an IPv6 packet. */
static __always_inline int span6_write_direct(struct __sk_buff *skb)
{
	struct nat6_span *span = bpf_map_lookup_elem(&sl_span6_v1, &sl_slot0);

	if (!span)
		return drop(CNT_DROP_MALFORMED);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *to = data + span->l3_off + IP6_SADDR_OFF;
	if (span->len == NAT6_SPAN_TCP) {
		if (to + NAT6_SPAN_TCP > data_end)
			return drop(CNT_DROP_MALFORMED);
		__builtin_memcpy(__builtin_assume_aligned(to, 8), span, NAT6_SPAN_TCP);
	} else {
		if (to + NAT6_SPAN_UDP > data_end)
			return drop(CNT_DROP_MALFORMED);
		__builtin_memcpy(__builtin_assume_aligned(to, 8), span, NAT6_SPAN_UDP);
	}
	return TC_ACT_OK;
}

/* ct6_follow: an established packet of an IPv6 flow, recorded on its entry
 * (ct6_touch) and translated (ct6_apply), in one subprogram: the span lives
 * in its frame, and the clock read (sl_now_tick) too, off the pipeline's,
 * which is at the verifier's bound on its deepest chain. A packet entering
 * at hook whose verdict is known (passes_translated, rewrite.h) leaves the
 * store to sl_write_span (SPAN_DEFERRED). */
__subprog int ct6_follow(struct __sk_buff *skb, struct packet6 *p6, struct ct6_value *v, enum hook hook)
{
	ct6_touch(v, &p6->p);
	return ct6_apply(skb, p6, v, passes_translated(hook, v->type, v->flags, v->pol_egress, v->tcp_seen));
}

/* cluster_local6: cluster_local (rewrite.h) with the IPv6 pod CIDR. */
static __always_inline int cluster_local6(struct __sk_buff *skb, const struct packet6 *p6,
					  const struct config *cfg, const struct config6 *cfg6)
{
	__u64 src[2], net[2], mask[2];

	if (cfg && (cfg->flags & CFG_LOCAL_BY_IFACE))
		return entered_local_iface(skb);
	__builtin_memcpy(src, p6->saddr, 16);
	__builtin_memcpy(net, cfg6->cluster_net, 16);
	__builtin_memcpy(mask, cfg6->cluster_mask, 16);
	return !(mask[0] | mask[1]) || ((src[0] & mask[0]) == net[0] && (src[1] & mask[1]) == net[1]);
}

/* snat_source6: snat_source (rewrite.h). It returns the node's IPv6 address
 * the flow leaves with, or NULL to keep the client's. */
static __always_inline const __u8 *snat_source6(struct __sk_buff *skb, const struct packet6 *p6,
						const struct fe_value *fe, const struct be6_value *be,
						int from_host, const struct config *cfg,
						const struct config6 *cfg6)
{
	if (!cfg6 || addr6_is_zero(cfg6->node_ip))
		return NULL;
	if ((from_host && (fe->flags & FE_EXTERNAL) && !(be->flags & BE_LOCAL)) ||
	    (!from_host && addr6_eq(be->addr, p6->saddr)) ||
	    (cfg && (cfg->flags & CFG_MASQUERADE_ALL)) ||
	    (!(fe->flags & FE_EXTERNAL) && !cluster_local6(skb, p6, cfg, cfg6)))
		return cfg6->node_ip;
	return NULL;
}
