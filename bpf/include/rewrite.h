/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Rewriting: what a flow's translation is, and how it is written.
 *
 * Addresses and ports are rewritten with incremental checksum updates. Every
 * write goes through skb helpers by offset, so it is safe whatever the packet
 * layout. A non-first fragment (l4_absent) has no L4 header: only its IP
 * header is rewritten (rewrite_addr_l3); the first fragment carries the
 * datagram's L4 checksum and ports.
 *
 * A flow's translation is decided once, for its first packet: the backend by
 * the service lookup (service.h), the source by snat_source below. ct_create
 * (ct_new.h) records both on the flow's entries, and ct_apply replays them on
 * every later packet of either direction. */
#pragma once

#include <bpf/bpf_core_read.h>

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "counters.h"
#include "csum.h"
#include "hook.h"
#include "ifstate.h"
#include "parse.h"
#include "service.h"

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

/* rewrite_addr rewrites an address and the checksums that cover it: the L4
 * checksum's pseudo header and the IPv4 header checksum. With a second
 * address family this and rewrite_addr_l3 are where it branches (IPv6 has no
 * header checksum, and 16-byte addresses); the callers above them do not. */
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
	    rewrite_port(skb, p, 2 /* dest: offset 2 in TCP and UDP */, p->dport, port))
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

/* word_diff: the ones'-complement sum that turns old into new within a
 * checksum, as bpf_csum_diff computes it (32-bit words as they lie in the
 * packet); fold32 folds sums of such to the 32 bits a checksum helper takes. */
static __always_inline __u64 word_diff(__u32 old, __u32 new)
{
	return (__u64)(__u32)~old + new;
}

static __always_inline __u32 fold32(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	return (__u32)s;
}

/* tuple_ports packs a source and a destination port for rewrite_tuple. */
static __always_inline __u32 tuple_ports(__be16 sport, __be16 dport)
{
	return (__u32)sport | (__u32)dport << 16;
}

/* nat_bytes: an IPv4 packet with a 20-byte header, from its header checksum
 * to its destination port: every byte a translation changes but the L4
 * checksum, so that one store writes them all. */
struct nat_bytes {
	__sum16 check;
	__be32 saddr;
	__be32 daddr;
	__be16 sport;
	__be16 dport;
} __attribute__((packed));
_Static_assert(sizeof(struct nat_bytes) == 14, "nat_bytes: the bytes from the IPv4 check to the destination port");

/* nat_span: the bytes from the IPv4 header checksum (a 20-byte header) to
 * the end of the L4 checksum, 28 for TCP (its sequence numbers, flags and
 * window lie between the ports and the checksum, and are written back as
 * they are) and 18 for UDP: one store writes a whole translation. As 16-bit
 * words, in packet order: [0] the IPv4 checksum, [1..4] the addresses,
 * [5..6] the ports, then the L4 header up to its checksum. */
struct nat_span {
	__u16 w[14];
	/* For a write deferred to sl_write_span (SPAN_DEFERRED): the IPv4
	 * header's offset in the packet and the span's length. In what was
	 * the struct's padding. */
	__u8 l3_off;
	__u8 len;
	__u16 unused;
} __attribute__((aligned(8)));
_Static_assert(sizeof(struct nat_span) == 32, "nat_span: the span and where it goes, in 32 bytes");
#define NAT_SPAN_TCP	28
#define NAT_SPAN_UDP	18
#define NAT_SPAN_OFF	offsetof(struct iphdr, check)
/* SPAN_DEFERRED: a translation built, its store left to sl_write_span
 * (below). WRITE_SPAN: "this packet passes once the span in sl_span_v1 is
 * written", which the entry program carries out (write_span). */
#define SPAN_DEFERRED	1
#define WRITE_SPAN	0x40000

/* The kernel's sk_buff, as much of it as is read here: CO-RE relocates the
 * field to where this kernel has it. ip_summed says what the L4 checksum
 * field holds (include/linux/skbuff.h). */
struct sk_buff {
	__u8 ip_summed:2;
} __attribute__((preserve_access_index));

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

enum skb_csum : __u8 {
	SKB_CHECKSUM_NONE = 0,
	SKB_CHECKSUM_UNNECESSARY = 1,
	SKB_CHECKSUM_COMPLETE = 2,	/* skb->csum sums the packet: a helper must follow the change */
	SKB_CHECKSUM_PARTIAL = 3,	/* the L4 field holds the pseudo header's sum alone */
};

/* skb_csum reads how the packet's checksums stand. The cast is the
 * verifier's (no call is made); the read, one byte. */
static __always_inline enum skb_csum skb_csum(struct __sk_buff *skb)
{
	struct sk_buff *k = bpf_cast_to_kern_ctx(skb);

	return (enum skb_csum)BPF_CORE_READ_BITFIELD(k, ip_summed);
}

/* l4_check_updated is the L4 checksum field after the pseudo header changed
 * by addrs and the L4 header by ports (ones'-complement differences, as
 * word_diff makes them), as bpf_l4_csum_replace would leave it:
 *  - CHECKSUM_PARTIAL: the field holds the pseudo header's sum, not
 *    complemented; the ports are summed later with the rest of the segment;
 *  - otherwise it holds the checksum itself, which both change.
 * A UDP checksum of 0 means "none" and stays 0; a computed 0 is sent as
 * 0xffff (BPF_F_MARK_MANGLED_0). */
static __always_inline __u16 l4_check_updated(__u16 check, enum skb_csum csum, __u8 proto, __u64 addrs, __u64 ports)
{
	__u16 updated;

	if (proto == IPPROTO_UDP && !check)
		return 0;
	if (csum == SKB_CHECKSUM_PARTIAL)
		updated = ~csum_fold((__u64)check + addrs);
	else
		updated = csum_fold((__u64)(__u32)~(__u32)check + addrs + ports);
	return proto == IPPROTO_UDP && !updated ? 0xffff : updated;
}

/* rewrite_tuple_helpers writes a translation with the checksum helpers:
 * for a header with options, and for CHECKSUM_COMPLETE, whose skb->csum
 * the helpers keep. A field at a time with options; else one store of
 * nat_bytes and the L4 checksum's two differences, kept apart because
 * BPF_F_PSEUDO_HDR moves skb->csum and a port change does not. A
 * subprogram: inline, what it keeps across its calls would take room on
 * the pipeline's frame, for packets that seldom come this way. */
__subprog int rewrite_tuple_helpers(struct __sk_buff *skb, struct packet *p, __be32 saddr,
				 __be32 daddr, __u32 ports)
{
	__be16 sport = ports, dport = ports >> 16;

	if (p->l4_off - p->l3_off != sizeof(struct iphdr)) {
		if (rewrite_dst(skb, p, daddr, dport))
			return -1;
		return rewrite_src(skb, p, saddr, sport);
	}
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	struct iphdr *ip = data + (p->l3_off & 0xff);
	if ((void *)(ip + 1) > data_end)
		return -1;
	__u64 addrs = word_diff(p->saddr, saddr) + word_diff(p->daddr, daddr);
	struct nat_bytes nb = {
		.check = csum_fold((__u16)~ip->check + addrs),
		.saddr = saddr, .daddr = daddr, .sport = sport, .dport = dport,
	};

	if (bpf_skb_store_bytes(skb, p->l3_off + NAT_SPAN_OFF, &nb, sizeof(nb), 0))
		return -1;
	if ((p->saddr != saddr || p->daddr != daddr) &&
	    bpf_l4_csum_replace(skb, l4_csum_off(p), 0, fold32(addrs), l4_csum_flags(p, 1)))
		return -1;
	if ((p->sport != sport || p->dport != dport) &&
	    bpf_l4_csum_replace(skb, l4_csum_off(p), 0,
				fold32(word_diff((__u32)p->sport | (__u32)p->dport << 16, ports)), l4_csum_flags(p, 0)))
		return -1;
	p->saddr = saddr;
	p->sport = sport;
	p->daddr = daddr;
	p->dport = dport;
	return 0;
}

/* span_load copies a span of the packet, at from, into a buffer of 8-byte
 * words: in 8-byte loads, where the compiler, which cannot know a packet
 * pointer's alignment, would load it byte by byte. The verifier lets such a
 * load through where the CPU reads unaligned words at full speed
 * (CONFIG_HAVE_EFFICIENT_UNALIGNED_ACCESS: x86-64, arm64, ppc64le, s390x). */
#define span_load(to, from, len) __builtin_memcpy((to), __builtin_assume_aligned((from), 8), (len))

/* rewrite_tuple_in translates a TCP or UDP packet to the addresses and ports
 * given (any may be the packet's own; ports as tuple_ports packs them),
 * building the new bytes in span; csum is what the packet's L4 checksum
 * field holds (skb_csum). A translation is one helper call, where a call per
 * field and checksum cost five for a destination and ten with the source,
 * and three until 2026-12-02: the IPv4 header checksum and the L4 checksum
 * are computed here, and with a 20-byte header both, the addresses and the
 * ports lie in one run of bytes (nat_span), which one store writes. A helper
 * call costs tens of ns on a kernel whose returns go through thunks (against
 * SRSO, as here). CHECKSUM_COMPLETE, and a header with options, take the
 * helpers (rewrite_tuple_helpers). The new tuple is read back from the span
 * after the store, so that nothing but the span lives across it. With
 * defer (a constant), the store is left to sl_write_span (SPAN_DEFERRED,
 * below) and the span says where it goes. No direct packet write here: one
 * anywhere in a program makes the verifier unclone every packet it sees (TCP's
 * are clones), translated or not; reads are free. */
static __always_inline int rewrite_tuple_in(struct __sk_buff *skb, struct packet *p, __be32 saddr, __be32 daddr,
					    __u32 ports, struct nat_span *span, enum skb_csum csum, int defer)
{
	if (saddr == p->saddr && daddr == p->daddr && ports == tuple_ports(p->sport, p->dport))
		return 0; /* a tracked flow that is not translated */
	if (p->l4_off - p->l3_off != sizeof(struct iphdr) || csum == SKB_CHECKSUM_COMPLETE)
		return rewrite_tuple_helpers(skb, p, saddr, daddr, ports);

	/* The span as it is, then what changes. The parser pulled the whole
	 * L4 header into the linear data. */
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *from = data + (p->l3_off & 0xff) + NAT_SPAN_OFF;
	__u64 addrs = word_diff(p->saddr, saddr) + word_diff(p->daddr, daddr);
	__u64 port_diff = csum == SKB_CHECKSUM_PARTIAL ? 0 : word_diff(tuple_ports(p->sport, p->dport), ports);
	__u32 len;
	/* The checksums are read from the packet, not back from the span
	 * just stored: a narrow load from inside a wider store may wait for
	 * the store. */
	if (p->proto == IPPROTO_TCP) {
		if (from + NAT_SPAN_TCP > data_end)
			return -1;
		span_load(span, from, NAT_SPAN_TCP);
		span->w[NAT_SPAN_TCP / 2 - 1] = l4_check_updated(*(__u16 *)(from + NAT_SPAN_TCP - 2), csum,
								 IPPROTO_TCP, addrs, port_diff);
		len = NAT_SPAN_TCP;
	} else {
		if (from + NAT_SPAN_UDP > data_end)
			return -1;
		span_load(span, from, NAT_SPAN_UDP);
		span->w[NAT_SPAN_UDP / 2 - 1] = l4_check_updated(*(__u16 *)(from + NAT_SPAN_UDP - 2), csum,
								 IPPROTO_UDP, addrs, port_diff);
		len = NAT_SPAN_UDP;
	}
	span->w[0] = csum_fold((__u16)~*(__u16 *)from + addrs);
	__builtin_memcpy(&span->w[1], &saddr, 4);
	__builtin_memcpy(&span->w[3], &daddr, 4);
	__builtin_memcpy(&span->w[5], &ports, 4);
	if (defer) {
		span->l3_off = p->l3_off;
		span->len = len;
	} else if (bpf_skb_store_bytes(skb, p->l3_off + NAT_SPAN_OFF, span, len, 0)) {
		return -1;
	}
	__builtin_memcpy(&p->saddr, &span->w[1], 4);
	__builtin_memcpy(&p->daddr, &span->w[3], 4);
	p->sport = span->w[5];
	p->dport = span->w[6];
	return defer ? SPAN_DEFERRED : 0;
}

/* sctp_translate4 (below): an SCTP packet's translation. */
int sctp_translate4(struct __sk_buff *skb, struct packet *p, __be32 saddr, __be32 daddr, __u32 ports);

/* rewrite_tuple: rewrite_tuple_in with its span on its own frame, for a
 * new flow's first packet: a subprogram, so that its bytes stay off its
 * callers' frames, which are deep enough. */
__subprog int rewrite_tuple(struct __sk_buff *skb, struct packet *p, __be32 saddr, __be32 daddr, __u32 ports)
{
	struct nat_span span;

	if (p->proto == IPPROTO_SCTP)
		return sctp_translate4(skb, p, saddr, daddr, ports);
	return rewrite_tuple_in(skb, p, saddr, daddr, ports, &span, skb_csum(skb), 0);
}

/* A CPU's span for established packets (ct_apply): off the pipeline's frame,
 * which is on the verifier's deepest chains. A packet's program runs to its
 * end on one CPU with bottom halves off, so no other packet's translation
 * comes between. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct nat_span);
} sl_span_v1 SEC(".maps");

/* sctp_rewrite_ports changes an SCTP packet's ports by ports_xor (the
 * ports' 4 bytes as the CPU loads them, old ^ new) and its CRC32c with them
 * (sctp.h): one store of the common header, which keeps skb->csum with
 * CHECKSUM_COMPLETE. A first fragment's CRC covers a datagram whose
 * length it does not carry: it cannot be updated, -1, and the caller drops
 * the fragment.
 *
 * A global function: the verifier checks it (and the CRC's 8,000 steps in
 * sctp_crc_delta) once, for any arguments, where a static function is
 * walked again on every way the pipeline reaches it. It ends chains of
 * calls whose frames sit near the stack's 512-byte bound, so its frame
 * holds no buffer: the header is copied into this CPU's span (sl_span_v1,
 * above), which an SCTP packet never uses otherwise (its translation,
 * sctp_translate4, is never deferred). */
struct sctp_scratch {
	__u32 ports;	/* the common header: both ports, as they lie in the packet */
	__be32 tag;
	__u32 crc;	/* little-endian, as the CPU (sctp.h) */
	/* The arguments, kept here across the calls rather than in registers
	 * the calls would make spill to a frame. */
	__u32 l4_off;
	__u32 ports_xor;
	__u32 crc_xor;
};
_Static_assert(sizeof(struct sctp_scratch) <= sizeof(struct nat_span), "sctp_scratch fits a CPU's span");

__attribute__((noinline)) int sctp_rewrite_ports(struct __sk_buff *skb, const struct packet *p, __u32 ports_xor)
{
	__u32 crc_xor = 0;

	if (!p)
		return -1;
	if (skb_csum(skb) != SKB_CHECKSUM_PARTIAL) {
		if (p->fragment)
			return -1;
		crc_xor = sctp_crc_delta(ports_xor, p->l3_off + p->ip_len - p->l4_off);
	}
	__u32 l4_off = p->l4_off;
	struct sctp_scratch *h = bpf_map_lookup_elem(&sl_span_v1, &sl_slot0);
	if (!h)
		return -1;
	h->l4_off = l4_off;
	h->ports_xor = ports_xor;
	h->crc_xor = crc_xor;
	if (bpf_skb_load_bytes(skb, h->l4_off, h, SCTP_COMMON_HLEN))
		return -1;
	h->ports ^= h->ports_xor;
	h->crc ^= h->crc_xor;
	return bpf_skb_store_bytes(skb, h->l4_off, h, SCTP_COMMON_HLEN, BPF_F_RECOMPUTE_CSUM);
}

/* sctp_translate4 translates an IPv4 SCTP packet to the addresses and
 * ports given (rewrite_tuple_in's arguments): the addresses with the IPv4
 * header's checksum alone, SCTP's having no pseudo header, the ports with
 * the CRC (sctp_rewrite_ports). A global function, called before the TCP
 * and UDP translation begins (rewrite_tuple, ct_apply): inline there, its
 * registers grew the frames of chains at the stack's bound. */
__attribute__((noinline)) int sctp_translate4(struct __sk_buff *skb, struct packet *p, __be32 saddr, __be32 daddr,
					      __u32 ports)
{
	if (!p)
		return -1;
	if (rewrite_addr_l3(skb, p, IP_DADDR_OFF, p->daddr, daddr) ||
	    rewrite_addr_l3(skb, p, IP_SADDR_OFF, p->saddr, saddr))
		return -1;
	p->saddr = saddr;
	p->daddr = daddr;
	__u32 changed = tuple_ports(p->sport, p->dport) ^ ports;
	if (changed && sctp_rewrite_ports(skb, p, changed))
		return -1;
	p->sport = ports;
	p->dport = ports >> 16;
	return 0;
}

/* ---- Replaying a flow's translation (conntrack.h records it) ---- */

/* ct_apply_fragment translates a non-first fragment: its IP header only. */
__subprog int ct_apply_fragment(struct __sk_buff *skb, struct packet *p, const struct ct_value *v)
{
	__be32 src = p->saddr, dst = p->daddr;

	if (v->type == CT_FORWARD) {
		dst = v->nat_addr;
		if (v->flags & CT_SNAT)
			src = v->snat_addr;
	} else {
		src = v->nat_addr;
		if (v->flags & CT_SNAT)
			dst = v->snat_addr;
	}
	if (rewrite_addr_l3(skb, p, IP_DADDR_OFF, p->daddr, dst) ||
	    rewrite_addr_l3(skb, p, IP_SADDR_OFF, p->saddr, src))
		return -1;
	p->saddr = src;
	p->daddr = dst;
	return 0;
}

/* ct_apply_sctp: ct_apply (below) for an SCTP packet (sctp_translate4).
 * A global function, whose call the entry programs' frames can afford. */
__attribute__((noinline)) int ct_apply_sctp(struct __sk_buff *skb, struct packet *p, const struct ct_value *v)
{
	if (!p || !v)
		return -1;
	int snat = v->flags & CT_SNAT;
	if (v->type == CT_FORWARD)
		return sctp_translate4(skb, p, snat ? v->snat_addr : p->saddr, v->nat_addr,
				       tuple_ports(snat ? v->snat_port : p->sport, v->nat_port));
	return sctp_translate4(skb, p, v->nat_addr, snat ? v->snat_addr : p->daddr,
			       tuple_ports(v->nat_port, snat ? v->snat_port : p->dport));
}

/* ct_apply translates a packet of a known flow: a forward entry's packets
 * (client to service) get the backend as destination, and the node's address
 * as source when the flow is SNATed; a reverse entry's (the replies) get the
 * opposite. With defer (a constant: the caller knows the packet's verdict
 * already), a translation in one store is left to sl_write_span and
 * SPAN_DEFERRED returned. */
static __always_inline int ct_apply(struct __sk_buff *skb, struct packet *p, const struct ct_value *v, int defer)
{
	if (p->l4_absent)
		return ct_apply_fragment(skb, p, v);
	if (p->proto == IPPROTO_SCTP)
		return ct_apply_sctp(skb, p, v);
	/* The calls first (to the compiler both are calls), while little
	 * else is live. */
	struct nat_span *span = bpf_map_lookup_elem(&sl_span_v1, &sl_slot0);
	if (!span)
		return -1;
	enum skb_csum csum = skb_csum(skb);
	int snat = v->flags & CT_SNAT;
	if (v->type == CT_FORWARD)
		return rewrite_tuple_in(skb, p, snat ? v->snat_addr : p->saddr, v->nat_addr,
					tuple_ports(snat ? v->snat_port : p->sport, v->nat_port), span, csum, defer);
	return rewrite_tuple_in(skb, p, v->nat_addr, snat ? v->snat_addr : p->daddr,
				tuple_ports(v->nat_port, snat ? v->snat_port : p->dport), span, csum, defer);
}

/* ct_apply_framed is ct_apply in a frame of its own, storing as it goes:
 * for the hooks where traffic leaves toward a workload or the node
 * (HOOK_TO_WL, HOOK_TO_HOST), whose entry frames start the verifier's
 * deepest chains, and for a packet entering whose verdict waits for more
 * than its entry (a flow not yet judged, hairpinned, routed by the FIB or
 * delivered locally). The inline translation's registers would take the
 * entry frames over the verifier's bound; the common packets entering take
 * ct_apply inline, and defer their store (pipeline, datapath.h). */
__subprog int ct_apply_framed(struct __sk_buff *skb, struct packet *p, const struct ct_value *v)
{
	return ct_apply(skb, p, v, 0);
}

/* ---- The deferred store: direct writes, in a program of their own ---- */

/* An established packet whose verdict is known before its translation is
 * written (ct_apply with defer) is written by sl_write_span, which the entry
 * program tail-calls (write_span): a direct store of the span, where
 * bpf_skb_store_bytes costs a helper call, its copy's call and their returns
 * (a third of an established packet's time on a kernel whose returns go
 * through thunks). Only a program of its own may write the packet directly:
 * the verifier makes any program that does unclone every cloned packet on
 * entry (a helper call), and the entry programs see every packet, translated
 * or not; sl_write_span sees only translated ones. SPAN_DEFERRED and
 * WRITE_SPAN are defined with nat_span. */

/* passes_translated tells whether an established packet entering at hook
 * (HOOK_FROM_WL or HOOK_FROM_HOST) passes once translated, whatever its
 * translation: what the established branch of pipeline() (datapath.h;
 * and pipeline6) decides after it, for the common flows. From a workload: a flow the stack
 * routes, neither hairpinned, nor leaving with the node's address, nor sent
 * back directly, whose egress policy allowed it (a reply is not judged);
 * from outside: a flow its host endpoint allowed. The fields are the
 * packet's conntrack entry's, of either family. */
static __always_inline int passes_translated(enum hook hook, enum ct_type type, enum ct_flags flags,
					     enum pol_verdict pol_egress, __u32 tcp_seen)
{
	int allowed = type != CT_FORWARD || pol_egress == POL_ALLOWED;

	if (hook == HOOK_FROM_HOST)
		return allowed;
	return hook == HOOK_FROM_WL && allowed && !(flags & (CT_HAIRPIN | CT_NODE_SOURCE | CT_DSR)) &&
	       (tcp_seen & CT_SEEN_STACK_ROUTED);
}

/* span_write_direct writes the span built for this IPv4 packet
 * (sl_write_span's body; span6_write_direct, rewrite6.h, the IPv6 one's). */
static __always_inline int span_write_direct(struct __sk_buff *skb)
{
	struct nat_span *span = bpf_map_lookup_elem(&sl_span_v1, &sl_slot0);

	if (!span)
		return drop(CNT_DROP_MALFORMED);
	void *data = (void *)(long)skb->data;
	void *data_end = (void *)(long)skb->data_end;
	void *to = data + span->l3_off + NAT_SPAN_OFF;
	/* 8-byte stores, as span_load's loads (an unaligned store is allowed
	 * where the CPU makes it at full speed). */
	if (span->len == NAT_SPAN_TCP) {
		if (to + NAT_SPAN_TCP > data_end)
			return drop(CNT_DROP_MALFORMED);
		__builtin_memcpy(__builtin_assume_aligned(to, 8), span, NAT_SPAN_TCP);
	} else {
		if (to + NAT_SPAN_UDP > data_end)
			return drop(CNT_DROP_MALFORMED);
		__builtin_memcpy(__builtin_assume_aligned(to, 8), span, NAT_SPAN_UDP);
	}
	return TC_ACT_OK;
}

/* swap_eth swaps an Ethernet frame's source and destination addresses, for
 * a frame sent back out of the interface it came in on. */
static __always_inline int swap_eth(struct __sk_buff *skb)
{
	__u8 macs[2 * ETH_ALEN], swapped[2 * ETH_ALEN];

	if (bpf_skb_load_bytes(skb, 0, macs, sizeof(macs)))
		return -1;
	__builtin_memcpy(swapped, macs + ETH_ALEN, ETH_ALEN);
	__builtin_memcpy(swapped + ETH_ALEN, macs, ETH_ALEN);
	return bpf_skb_store_bytes(skb, 0, swapped, sizeof(swapped), 0);
}

/* hairpin_return sends a packet of a workload's flow to itself (through its
 * own Service: DNATed to itself and SNATed to the node's address, or the
 * reply to such a packet) straight back into the workload. Through the
 * node's stack it would be lost: the kernel drops a packet that arrives with
 * one of the node's own addresses as its source as a spoof (a martian), and
 * the reply, from the Service address, fails a strict reverse-path check on
 * the pod's interface. kube-proxy masquerades after routing, where neither
 * check applies; at TC, before routing, the packet skips the stack. Only a
 * workload's interface (with an Ethernet header) hairpins. */
static __always_inline int hairpin_return(struct __sk_buff *skb)
{
	if (swap_eth(skb))
		return drop(CNT_DROP_MALFORMED);
	count(CNT_HAIRPIN_RETURNED);
	return bpf_redirect(skb->ifindex, 0);
}

/* ---- Which new flows leave with the node's address ---- */

/* cluster_local is kube-proxy's local-traffic detector: whether a packet is
 * the cluster's own (no masquerade to a ClusterIP), by the interface it came
 * in on (CFG_LOCAL_BY_IFACE) or by its source in the pod CIDR. Without a
 * CIDR, as kube-proxy without --cluster-cidr, every source is local. */
static __always_inline int cluster_local(struct __sk_buff *skb, const struct packet *p, const struct config *cfg)
{
	if (cfg->flags & CFG_LOCAL_BY_IFACE)
		return entered_local_iface(skb);
	return !cfg->cluster_mask || (p->saddr & cfg->cluster_mask) == cfg->cluster_net;
}

/* snat_source decides the source a new flow to a Service leaves with: the
 * node's address, or 0 to keep the client's. SNAT only where the reply would
 * otherwise not come back through this node: external traffic forwarded to
 * another node, and a pod reaching itself through its Service (hairpin); and
 * where the operator asks: --masquerade-all, or kube-proxy's rule that
 * ClusterIP traffic that is not the cluster's own (--detect-local-mode) is
 * masqueraded, whatever interface it came in on. Without a node address
 * (cfg->node_ip 0) nothing is SNATed: such flows keep the client's address. */
static __always_inline __be32 snat_source(struct __sk_buff *skb, const struct packet *p,
					  const struct fe_value *fe, const struct be_value *be,
					  int from_host, const struct config *cfg)
{
	if (!cfg || !cfg->node_ip)
		return 0;
	if ((from_host && (fe->flags & FE_EXTERNAL) && !(be->flags & BE_LOCAL)) ||
	    (!from_host && be->addr == p->saddr) ||
	    (cfg->flags & CFG_MASQUERADE_ALL) ||
	    (!(fe->flags & FE_EXTERNAL) && !cluster_local(skb, p, cfg)))
		return cfg->node_ip;
	return 0;
}
