/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The IPv6 service datapath: parse -> conntrack -> service lookup -> NAT ->
 * verdict, as datapath.h's pipeline for IPv4, on the IPv6 maps.
 *
 * Served today: ClusterIP, NodePort (on the node's IPv6 addresses and the
 * wildcard), externalIPs and load balancer IPs; traffic policies, topology,
 * session affinity and source ranges (all in the shared struct fe_value);
 * SNAT to the node's IPv6 address where kube-proxy masquerades; the clash
 * rules (ct6_create); fragments; hairpin; TCP RST and ICMPv6 port unreachable
 * for a Service without endpoints; echo replies from service IPs; ICMPv6
 * errors about NATed flows (Packet Too Big first: IPv6 routers never fragment,
 * so path-MTU discovery must work through the proxy) translated back.
 * Neighbour discovery and other ICMPv6 pass untouched.
 *
 * Policy: a workload's policy judges its IPv6 flows as it judges IPv4 ones
 * (policy.h), the flow's addresses handed over in the per-CPU scratch map
 * (policy_handoff6). Only ICMPv6 echo requests are judged among ICMPv6 (as
 * ICMP echo is): neighbour discovery and MLD never are, so a pod under a
 * deny-all policy still resolves its neighbours. Host endpoints judge
 * IPv6 as IPv4: external flows to the node or a Service on their tuple as
 * it came (before DNAT), the node's own flows as they leave, failsafe ports
 * excepted. The pipeline returns TC verdicts or JUDGE_BY_POLICY,
 * never FORWARD_BY_FIB (IPv6 drops no packet for a local source address). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack6.h"
#include "counters.h"
#include "csum.h"
#include "dsr6.h"
#include "events.h"
#include "hook.h"
#include "ifstate.h"
#include "ipv6.h"
#include "policy.h"
#include "reject.h"
#include "rewrite6.h"
#include "service6.h"
#include "svcstats.h"

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

/* reject6 answers a new flow to a Service without endpoints. Each answer is
 * a function of its own, so the stack holds one reply at a time: the
 * pipeline's frames and the UDP reply's quote fill most of the 512 bytes. */
static __always_inline int reject6(struct __sk_buff *skb, const struct packet6 *p6)
{
	int err = p6->p.proto == IPPROTO_TCP ? reject6_tcp(skb, p6) : reject6_udp(skb, p6);

	if (err)
		return drop(CNT_DROP_REJECT_FAILED);
	count(CNT_REJECT_NO_ENDPOINTS);
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

/* ---- Policy: policy.h's hand-off for IPv6 flows ---- */

/* policy_handoff6: policy_handoff for an IPv6 packet. Its addresses go to
 * the per-CPU scratch map; cb carries the rest, with POLICY_IPV6. */
static __always_inline int policy_handoff6(struct __sk_buff *skb, const struct packet6 *p6, __u32 dir, __u32 slot)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
	const struct packet *p = &p6->p;

	if (!sc)
		return drop(CNT_DROP_POLICY_MISSING);
	addr6_copy(sc->pol.saddr, p6->saddr);
	addr6_copy(sc->pol.daddr, p6->daddr);
	skb->cb[0] = 0;
	skb->cb[1] = 0;
	skb->cb[2] = (__u32)p->sport | ((__u32)p->dport << 16);
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) |
		     (dir << POLICY_DIR_SHIFT) | POLICY_IPV6 | policy_dry_run();
	skb->cb[4] = slot;
	return JUDGE_BY_POLICY;
}

/* policy_tuple_pre_nat6 and policy_handoff_pre_nat6: policy.h's pre-NAT
 * pair (a host endpoint judges external traffic to a Service on the tuple
 * as it came) for an IPv6 packet; nothing between the two may use cb or the
 * scratch map's tuple (ct6_create leaves it alone). */
static __always_inline int policy_tuple_pre_nat6(struct __sk_buff *skb, const struct packet6 *p6)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);

	if (!sc)
		return -1;
	addr6_copy(sc->pol.saddr, p6->saddr);
	addr6_copy(sc->pol.daddr, p6->daddr);
	skb->cb[0] = 0;
	skb->cb[1] = 0;
	skb->cb[2] = (__u32)p6->p.sport | ((__u32)p6->p.dport << 16);
	return 0;
}

static __always_inline int policy_handoff_pre_nat6(struct __sk_buff *skb, const struct packet *p, __u32 dir, __u32 slot)
{
	skb->cb[3] = (__u32)p->proto | ((__u32)p->icmp_type << 8) | ((__u32)p->icmp_code << 16) |
		     (dir << POLICY_DIR_SHIFT) | POLICY_PRE_NAT | POLICY_IPV6 | policy_dry_run();
	skb->cb[4] = slot;
	return JUDGE_BY_POLICY;
}

/* enforce6_judged: enforce_judged (policy.h) on an IPv6 flow's entry. */
__subprog int enforce6_judged(struct __sk_buff *skb, const struct packet6 *p6, struct ct6_value *v, __u32 dir)
{
	enum pol_verdict pv = dir == POLICY_DIR_EGRESS ? v->pol_egress : v->pol_ingress;

	if (pv == POL_DENIED)
		return drop(CNT_DROP_POLICY);
	__u32 slot = policy_slot(skb, dir);
	if (slot == IFSTATE_NO_POLICY) {
		if (dir == POLICY_DIR_EGRESS)
			v->pol_egress = POL_ALLOWED;
		else
			v->pol_ingress = POL_ALLOWED;
		return TC_ACT_OK;
	}
	return policy_handoff6(skb, p6, dir, slot);
}

/* enforce6: enforce (policy.h), the allowed flow's check inline. */
static __always_inline int enforce6(struct __sk_buff *skb, const struct packet6 *p6, struct ct6_value *v, __u32 dir)
{
	if ((dir == POLICY_DIR_EGRESS ? v->pol_egress : v->pol_ingress) == POL_ALLOWED)
		return TC_ACT_OK;
	return enforce6_judged(skb, p6, v, dir);
}

/* judge_stateless6: judge_stateless (policy.h) for an IPv6 packet. */
static __always_inline int judge_stateless6(struct __sk_buff *skb, const struct packet6 *p6, __u32 dir)
{
	__u32 slot = policy_slot(skb, dir);

	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	return policy_handoff6(skb, p6, dir, slot);
}

/* policy_record6 writes a policy's verdict on both entries of the IPv6 flow
 * whose tuple (as the destination sees it) policy_handoff6 left. */
/* ev_policy_drop writes the event of a flow a policy denied: its tuple as
 * the policy judged it (cb, and the IPv6 scratch), the rule that decided. */
__subprog void ev_policy_drop(struct __sk_buff *skb)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);
	struct event *e = ev_reserve(EV_DROP, (skb->cb[3] >> POLICY_DIR_SHIFT) & 1 ? HOOK_TO_WL : HOOK_FROM_WL, skb);

	if (!e)
		return;
	e->reason = CNT_DROP_POLICY;
	e->rule_id = skb->cb[4];
	e->proto = skb->cb[3] & 0xff;
	e->sport = skb->cb[2] & 0xffff;
	e->dport = skb->cb[2] >> 16;
	if (skb->cb[3] & POLICY_IPV6) {
		e->family = 6;
		if (sc) {
			addr6_copy(e->saddr, sc->pol.saddr);
			addr6_copy(e->daddr, sc->pol.daddr);
		}
	} else {
		e->family = 4;
		ev_addr4(e->saddr, skb->cb[0]);
		ev_addr4(e->daddr, skb->cb[1]);
	}
	ev_submit(e);
}

/* ev_flow_end6 writes an IPv6 service flow's end (ev_flow_end4). */
static __always_inline void ev_flow_end6_write(const struct __sk_buff *skb, const struct packet6 *p6, enum hook hook,
					       __u32 svc_id)
{
	struct event *e = ev_reserve(EV_FLOW_END, hook, skb);

	if (!e)
		return;
	e->family = 6;
	addr6_copy(e->saddr, p6->saddr);
	addr6_copy(e->daddr, p6->daddr);
	e->sport = p6->p.sport;
	e->dport = p6->p.dport;
	e->proto = p6->p.proto;
	e->svc_id = svc_id;
	e->reason = p6->p.tcp_flags;
	ev_submit(e);
}

/* ev_flow_start6 writes the start of the flow new_flow6 has just created
 * (key: its tuple as it came), from its forward entry. Called by pipeline6,
 * outside new_flow6's frame. */
__subprog void ev_flow_start6(const struct __sk_buff *skb, const struct ct6_key *key, enum hook hook)
{
	const struct ct6_value *fwd = bpf_map_lookup_elem(&sl_ct6_v1, key);
	struct event *e;

	if (!fwd || !fwd->svc_id || !(e = ev_reserve(EV_FLOW_START, hook, skb)))
		return;
	e->family = 6;
	addr6_copy(e->saddr, key->saddr);
	addr6_copy(e->daddr, key->daddr);
	e->sport = key->sport;
	e->dport = key->dport;
	e->proto = key->proto;
	e->svc_id = fwd->svc_id;
	addr6_copy(e->nat_addr, fwd->nat_addr);
	e->nat_port = fwd->nat_port;
	ev_submit(e);
}

/* ev_flow_end6 is ev_flow_end4 (events.h) for an IPv6 flow. */
__subprog void ev_flow_end6(const struct __sk_buff *skb, const struct packet6 *p6, enum hook hook,
			    const struct ct6_value *v)
{
	if (!(p6->p.tcp_flags & TCP_FLAG_RST)) {
		struct ct6_value *o = bpf_map_lookup_elem(&sl_ct6_v1, &v->peer);
		if (!o || !(o->tcp_seen & TCP_FLAG_FIN))
			return;
	}
	ev_flow_end6_write(skb, p6, hook, v->svc_id);
}

__subprog int policy_record6(struct __sk_buff *skb, __u32 dir, enum pol_verdict verdict)
{
	__u32 zero = 0;
	struct ct6_scratch *sc = bpf_map_lookup_elem(&sl_scratch6_v1, &zero);

	if (!sc)
		return 0;
	struct ct6_key key = { .sport = skb->cb[2] >> 16, .dport = skb->cb[2] & 0xffff, .proto = skb->cb[3] & 0xff };
	struct ct6_value *rev, *fwd;
	if (skb->cb[3] & POLICY_PRE_NAT) {
		/* The tuple is the forward key itself; the reverse entry is its peer. */
		key.sport = skb->cb[2] & 0xffff;
		key.dport = skb->cb[2] >> 16;
		addr6_copy(key.saddr, sc->pol.saddr);
		addr6_copy(key.daddr, sc->pol.daddr);
		fwd = bpf_map_lookup_elem(&sl_ct6_v1, &key);
		if (!fwd)
			return 0;
		rev = bpf_map_lookup_elem(&sl_ct6_v1, &fwd->peer);
		if (!rev)
			return 0;
	} else {
		addr6_copy(key.saddr, sc->pol.daddr);
		addr6_copy(key.daddr, sc->pol.saddr);
		rev = bpf_map_lookup_elem(&sl_ct6_v1, &key);
		if (!rev)
			return 0;
		fwd = bpf_map_lookup_elem(&sl_ct6_v1, &rev->peer);
	}
	if (dir == POLICY_DIR_EGRESS) {
		rev->pol_egress = verdict;
		if (fwd)
			fwd->pol_egress = verdict;
	} else {
		rev->pol_ingress = verdict;
		if (fwd)
			fwd->pol_ingress = verdict;
	}
	return 0;
}

/* judged_at: the policy direction a workload's hook judges (egress leaving
 * the workload, ingress entering it), or -1 at a host hook. */
static __always_inline int judged_at(enum hook hook)
{
	if (hook == HOOK_FROM_WL)
		return POLICY_DIR_EGRESS;
	if (hook == HOOK_TO_WL)
		return POLICY_DIR_INGRESS;
	return -1;
}

__subprog int handle_icmp6(struct __sk_buff *skb, struct packet6 *p6, enum hook hook)
{
	switch (p6->p.icmp_type) {
	case ICMPV6_ECHO_REQUEST: {
		/* Judged packet by packet at a workload (ICMPv6 has no
		 * conntrack), as ICMP echo is; replies pass. */
		int dir = judged_at(hook);
		if (dir >= 0) {
			int verdict = judge_stateless6(skb, p6, dir);
			if (verdict != TC_ACT_OK)
				return verdict;
		}
		if ((hook != HOOK_FROM_WL && hook != HOOK_FROM_HOST) || !is_service_ip6(p6->daddr))
			return TC_ACT_OK;
		if (answer_echo6(skb, p6))
			return drop(CNT_DROP_REJECT_FAILED);
		count(CNT_ICMP_ECHO_ANSWERED);
		return bpf_redirect(skb->ifindex, 0);
	}
	case ICMPV6_DEST_UNREACH:
	case ICMPV6_PKT_TOOBIG:
	case ICMPV6_TIME_EXCEED:
		if (icmp6_error_rnat(skb, p6))
			return drop(CNT_DROP_MALFORMED);
		return TC_ACT_OK;
	}
	return TC_ACT_OK; /* neighbour discovery, router advertisements, MLD, ... */
}

/* track_flow6: track_flow (datapath.h). key: the packet's tuple; dir and
 * slot: the policy that judges the flow (IFSTATE_NO_POLICY: none). */
__subprog int track_flow6(struct __sk_buff *skb, struct packet6 *p6, const struct ct6_key *key, __u32 dir, __u32 slot)
{
	struct be6_value self = { .port = p6->p.dport };
	__u8 snat_addr[16] = {};
	int snat = 0;
	__u8 flags = 0;
	__be16 sport;

	if (p6->p.l4_absent)
		return TC_ACT_OK;
	addr6_copy(self.addr, p6->daddr);
	int err = ct6_create(p6, key, 0, &self, &snat, snat_addr, &flags,
			     dir == POLICY_DIR_EGRESS && slot != IFSTATE_NO_POLICY ? POL_UNJUDGED : POL_ALLOWED, &sport);
	if (err)
		return drop_create_failed(err, snat);
	if (snat && rewrite_src6(skb, p6, snat_addr, sport))
		return drop(CNT_DROP_MALFORMED);
	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	return policy_handoff6(skb, p6, dir, slot);
}

/* to_workload_new6: to_workload_new (datapath.h). */
__subprog int to_workload_new6(struct __sk_buff *skb, struct packet6 *p6, const struct ct6_key *key)
{
	struct ct6_value *r = ct6_lookup_reversed(p6);
	int syn = p6->p.proto == IPPROTO_TCP && (p6->p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;

	if (r && r->type == CT_FORWARD)
		return TC_ACT_OK;
	if (r && !(syn && (r->tcp_seen & TCP_FLAG_ACK)))
		return enforce6(skb, p6, r, POLICY_DIR_INGRESS);
	if ((p6->p.proto == IPPROTO_TCP && !syn) || (p6->p.proto == IPPROTO_UDP && !r && adopting()))
		return judge_stateless6(skb, p6, POLICY_DIR_INGRESS);
	return track_flow6(skb, p6, key, POLICY_DIR_INGRESS, policy_slot(skb, POLICY_DIR_INGRESS));
}

/* handled_upstream6: handled_upstream (datapath.h). */
__subprog int handled_upstream6(struct __sk_buff *skb, struct packet6 *p6, enum hook hook)
{
	if (hook != HOOK_TO_WL)
		return TC_ACT_OK;
	struct ct6_value *r = ct6_lookup_reversed(p6);
	if (r)
		return r->type == CT_FORWARD ? TC_ACT_OK : enforce6(skb, p6, r, POLICY_DIR_INGRESS);
	if (p6->p.l4_absent)
		return TC_ACT_OK;
	return judge_stateless6(skb, p6, POLICY_DIR_INGRESS);
}

/* host_new_flow_out6: host_new_flow_out (datapath.h), whose comment states the rules. */
__subprog int host_new_flow_out6(struct __sk_buff *skb, struct packet6 *p6, const struct ct6_key *key)
{
	const struct packet *p = &p6->p;

	if (skb->ingress_ifindex ||
	    (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN))
		return TC_ACT_OK;
	struct ifstate_key k = { .ifindex = skb->ifindex };
	struct ifstate_value *st = bpf_map_lookup_elem(&sl_ifstate_v1, &k);

	if (st && (st->ingress_policy != IFSTATE_NO_POLICY || st->egress_policy != IFSTATE_NO_POLICY))
		return track_flow6(skb, p6, key, POLICY_DIR_INGRESS, failsafe(p) ? IFSTATE_NO_POLICY : st->ingress_policy);
	if (!skb->sk)
		return TC_ACT_OK;
	return track_flow6(skb, p6, key, POLICY_DIR_INGRESS, IFSTATE_NO_POLICY);
}

/* NEW_FLOW_REJECT: new_flow6's "answer with a reject", which pipeline6 sends
 * from its own frame, so that the reply's stack does not add to the flow
 * creation's. */
#define NEW_FLOW_REJECT 0x30000

/* new_flow6: new_flow (datapath.h). key: the packet's tuple. */
__subprog int new_flow6(struct __sk_buff *skb, struct packet6 *p6, enum hook hook, const struct fe_value *fe,
			const struct ct6_key *key)
{
	struct packet *p = &p6->p;
	int from_host = hook == HOOK_FROM_HOST;
	struct be6_value be = {};
	__u32 ordinal;

	if (!src_allowed6(fe, p6->saddr))
		return drop(CNT_DROP_SRC_RANGE);

	int local_only = (fe->flags & FE_INT_LOCAL) || (from_host && (fe->flags & FE_EXT_LOCAL));
	int picked = pick_backend6(fe, p6->saddr, p->sport, 1, local_only, &be, &ordinal);
	if (picked == PICK_BACKEND_MISSING) {
		/* A sync replaced the frontend under this packet (new_flow). */
		const struct fe_value *now = fe6_lookup(p6->daddr, p->dport, p->proto);
		if (now && now != fe) {
			fe = now;
			local_only = (fe->flags & FE_INT_LOCAL) || (from_host && (fe->flags & FE_EXT_LOCAL));
			picked = pick_backend6(fe, p6->saddr, p->sport, 1, local_only, &be, &ordinal);
		}
	}
	switch (picked) {
	case PICK_NO_ENDPOINTS:
		return NEW_FLOW_REJECT;
	case PICK_NO_LOCAL:
		return drop(CNT_DROP_NO_LOCAL_BACKEND);
	case PICK_BACKEND_MISSING:
		return drop(CNT_DROP_BACKEND_MISSING);
	}

	__u8 snat_addr[16] = {};
	struct config *cfg = config_get();
	/* DSR as new_flow's, where the packet can carry the option (dsr6.h);
	 * pipeline6 inserts it (NEW_FLOW_DSR). */
	int dsr = from_host && (fe->flags & FE_EXTERNAL) && !(be.flags & BE_LOCAL) && dsr_wanted(cfg, p) && dsr6_fits(p);
	const __u8 *node = dsr ? NULL : snat_source6(skb, p6, fe, &be, from_host, cfg, config6_get());
	int snat = node != NULL;
	if (node)
		addr6_copy(snat_addr, node);
	__u8 flags = (from_host ? CT_FROM_HOST : 0) | ((be.flags & BE_LOCAL) ? CT_BACKEND_LOCAL : 0) |
		     (snat ? CT_SNAT : 0) | (!from_host && addr6_eq(be.addr, p6->saddr) ? CT_HAIRPIN : 0) |
		     (dsr ? CT_DSR : 0);
	/* As new_flow: a direction that leaves a workload with a node address
	 * as source has its path MTU checked here (fib.h). */
	if (!(flags & CT_HAIRPIN) && ((!from_host && snat) || is_host_ip6(p6->daddr)))
		flags |= CT_NODE_SOURCE;
	/* A workload's egress policy judges the flow on the tuple the
	 * destination sees (after NAT); external traffic its host endpoint's
	 * ingress policy, on the tuple as it came (new_flow). */
	__u32 slot = from_host ? host_ingress_slot(skb, p, 1) : policy_slot(skb, POLICY_DIR_EGRESS);
	if (from_host && slot != IFSTATE_NO_POLICY && policy_tuple_pre_nat6(skb, p6))
		return drop(CNT_DROP_POLICY_MISSING);
	__be16 sport;
	int err = ct6_create(p6, key, fe->svc_id, &be, &snat, snat_addr, &flags,
			     slot == IFSTATE_NO_POLICY ? POL_ALLOWED : POL_UNJUDGED, &sport);
	if (err)
		return drop_create_failed(err, snat);
	if (rewrite_dst6(skb, p6, be.addr, be.port))
		return drop(CNT_DROP_MALFORMED);
	if (snat && rewrite_src6(skb, p6, snat_addr, sport))
		return drop(CNT_DROP_MALFORMED);
	svcstats_count(fe->svc_id, p, 0, 1);
	if (slot == IFSTATE_NO_POLICY)
		return (flags & CT_HAIRPIN) ? hairpin_return(skb) : dsr ? TC_ACT_OK | NEW_FLOW_DSR : TC_ACT_OK;
	if (from_host)
		return policy_handoff_pre_nat6(skb, p, POLICY_DIR_EGRESS, slot) | (dsr ? NEW_FLOW_DSR : 0);
	int verdict = policy_handoff6(skb, p6, POLICY_DIR_EGRESS, slot);
	return (flags & CT_HAIRPIN) ? hairpin_verdict(skb, verdict) : verdict;
}

#define FRAGMENT_CONTINUES 0x40000

/* fragment6: a first fragment records its ports; a later one gets them
 * (frag.h's rules). Returns FRAGMENT_CONTINUES when the packet goes on
 * through the pipeline, else its verdict. */
__subprog int fragment6(struct packet6 *p6)
{
	if (!p6->p.l4_absent) {
		frag6_learn(p6);
		return FRAGMENT_CONTINUES;
	}
	if (frag6_ports(p6)) {
		if (is_service_ip6(p6->daddr))
			return drop(CNT_DROP_FRAGMENT_UNKNOWN);
		count(CNT_PASS_FRAGMENT);
		return TC_ACT_OK;
	}
	count(CNT_FRAGMENT_TRANSLATED);
	return FRAGMENT_CONTINUES;
}

/* pipeline6: pipeline (datapath.h) for a packet whose skb->protocol is
 * IPv6. A subprogram: its frame is not the IPv4 path's (the entry programs'
 * frames add up with the stages' against the verifier's 512 bytes). */
__subprog int pipeline6(struct __sk_buff *skb, enum hook hook, __u32 l2_len)
{
	struct packet6 p6;
	struct packet *p = &p6.p;
	struct ct6_key key;

	switch (parse_packet6(skb, &p6, l2_len)) {
	case PARSE_NOT_IPV4:
		return TC_ACT_OK;
	case PARSE_MALFORMED:
		return drop(CNT_DROP_MALFORMED);
	}
	if (p->proto != IPPROTO_TCP && p->proto != IPPROTO_UDP) {
		if (p->fragment) {
			count(CNT_PASS_FRAGMENT);
			return TC_ACT_OK;
		}
		if (p->proto == IPPROTO_ICMPV6)
			return handle_icmp6(skb, &p6, hook);
		/* judge_other (datapath.h): isolation holds for every protocol. */
		int dir = judged_at(hook);
		return dir < 0 ? TC_ACT_OK : judge_stateless6(skb, &p6, dir);
	}
	if (p->fragment) {
		int verdict = fragment6(&p6);
		if (verdict != FRAGMENT_CONTINUES)
			return verdict;
	}
	/* Translated once on the node, where it entered (datapath.h); where it
	 * leaves, only a workload's ingress policy judges it. */
	if ((hook == HOOK_TO_WL || hook == HOOK_TO_HOST) && entered_managed(skb))
		return handled_upstream6(skb, &p6, hook);

	ct6_key_of(&p6, &key);
	struct ct6_value *v = bpf_map_lookup_elem(&sl_ct6_v1, &key);
	if (v && v->type == CT_FORWARD &&
	    ((p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN || (!v->svc_id && p->proto == IPPROTO_UDP)) &&
	    superseded6(&p6, v))
		v = NULL;
	if (v) {
		if ((p->tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) && v->svc_id &&
		    !(v->tcp_seen & (TCP_FLAG_FIN | TCP_FLAG_RST)) && ev_flow_events())
			ev_flow_end6(skb, &p6, hook, v);
		if (v->svc_id)
			svcstats_count(v->svc_id, p, v->type == CT_REVERSE, 0);
		/* A UDP flow's datagrams carry the DSR option where they can
		 * (datapath.h, dsr6.h). */
		if (hook == HOOK_FROM_HOST && (v->flags & (CT_DSR | CT_BACKEND_LOCAL)) == CT_DSR &&
		    p->proto == IPPROTO_UDP && v->type == CT_FORWARD && dsr6_fits(p))
			dsr6_push(skb, &p6, &key);
		/* A packet entering whose verdict is known leaves its
		 * translation's store to sl_write_span (rewrite.h); one
		 * translated otherwise goes on to the same verdict below. */
		int err = ct6_follow(skb, &p6, v, hook);
		if (err == SPAN_DEFERRED)
			return WRITE_SPAN;
		if (err)
			return drop(CNT_DROP_MALFORMED);
		if (hook == HOOK_FROM_WL && (v->flags & CT_HAIRPIN))
			return hairpin_verdict(skb, v->type == CT_FORWARD ? enforce6(skb, &p6, v, POLICY_DIR_EGRESS) : TC_ACT_OK);
		/* Leaving a workload with a node address as source: the stack
		 * forwards it, but could not answer it were it too big (fib.h). */
		if (hook == HOOK_FROM_WL && (v->flags & CT_NODE_SOURCE) && is_host_ip6(p6.saddr))
			return fib_verdict(skb, v->type == CT_FORWARD ? enforce6(skb, &p6, v, POLICY_DIR_EGRESS) : TC_ACT_OK);
		/* A direct reply, now from the frontend (dsr6.h): its length is
		 * checked as a node-sourced one's. */
		if (hook == HOOK_FROM_WL && (v->flags & CT_DSR) && v->type == CT_REVERSE)
			return FORWARD_BY_FIB;
		if (hook == HOOK_FROM_WL)
			return deliver_flow(skb, v->type == CT_FORWARD ? enforce6(skb, &p6, v, POLICY_DIR_EGRESS) : TC_ACT_OK,
					    &v->tcp_seen, 1);
		if (v->type == CT_FORWARD && hook == HOOK_TO_WL)
			return enforce6(skb, &p6, v, POLICY_DIR_INGRESS);
		/* Host endpoints, as pipeline (datapath.h). */
		if (v->type == CT_FORWARD && hook == HOOK_FROM_HOST && v->pol_egress != POL_ALLOWED)
			return drop(CNT_DROP_POLICY);
		if (v->type == CT_FORWARD && hook == HOOK_TO_HOST && !skb->ingress_ifindex)
			return enforce6(skb, &p6, v, POLICY_DIR_INGRESS);
		return TC_ACT_OK; /* a reply, or a hook without policy */
	}

	if (p->l4_absent) {
		/* untracked_fragment (datapath.h) */
		if (hook == HOOK_TO_WL)
			return to_workload_new6(skb, &p6, &key);
		if (hook != HOOK_TO_HOST && fe6_lookup(p6.daddr, p->dport, p->proto))
			return drop(CNT_DROP_FRAGMENT_UNKNOWN);
		return TC_ACT_OK;
	}
	if (hook == HOOK_TO_HOST)
		return host_new_flow_out6(skb, &p6, &key);
	if (hook == HOOK_TO_WL)
		return to_workload_new6(skb, &p6, &key);
	struct fe_value *fe;
	if (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN) {
		/* A connection moved here, with DSR (moved_flow, datapath.h). */
		struct config *cfg = config_get();
		if (hook != HOOK_FROM_HOST || !cfg || !(cfg->flags & CFG_DSR_TCP))
			return hook == HOOK_FROM_WL ? stack_routed(judge_stateless6(skb, &p6, POLICY_DIR_EGRESS)) : TC_ACT_OK;
		fe = fe6_lookup(p6.daddr, p->dport, p->proto);
		if (!fe || !(fe->flags & FE_EXTERNAL))
			return TC_ACT_OK;
	} else if (p->proto == IPPROTO_UDP && adopting()) {
		/* A flow netfilter may hold (pipeline, datapath.h). */
		return hook == HOOK_FROM_WL ? stack_routed(judge_stateless6(skb, &p6, POLICY_DIR_EGRESS)) : TC_ACT_OK;
	} else {
		fe = fe6_lookup(p6.daddr, p->dport, p->proto);
		if (!fe)
			return track_flow6(skb, &p6, &key, POLICY_DIR_EGRESS,
					   hook == HOOK_FROM_WL ? policy_slot(skb, POLICY_DIR_EGRESS)
								: host_ingress_slot(skb, p, is_host_ip6(p6.daddr)));
	}
	int verdict = new_flow6(skb, &p6, hook, fe, &key);
	if (verdict != TC_ACT_SHOT && verdict != NEW_FLOW_REJECT && ev_flow_events())
		ev_flow_start6(skb, &key, hook);
	if (verdict & NEW_FLOW_DSR) {
		verdict &= ~NEW_FLOW_DSR;
		if (dsr6_push(skb, &p6, &key))
			return drop(CNT_DROP_DSR_FAILED);
	}
	return verdict == NEW_FLOW_REJECT ? reject6(skb, &p6) : verdict;
}
