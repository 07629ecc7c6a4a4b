/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* XDP acceleration of external flows: a flow that enters from outside to an
 * external frontend (a NodePort, LoadBalancer or externalIP) and goes to a
 * backend on another node, SNATed (and its replies) or by DSR (dsr.h's
 * option, dsr6.h's header, inserted as TC inserts them), is started,
 * translated and sent on from the driver, before an skb exists.
 *
 * It writes and reads the TC path's conntrack entries as they are. A new
 * flow (a SYN, a datagram no entry knows) is balanced here as new_flow
 * balances it at TC: the same source ranges, the same pick (Maglev or
 * random, affinity), the same entries from ct_create, the same counters
 * and events. The packets that change a flow's state (a SYN-ACK, a FIN, a
 * RST, the first ACK of a direction, a datagram's first answer) pass to TC,
 * and everything in between is translated here exactly as ct_apply would,
 * with the FIB's next hop as fib_forward would choose it. So a flow may
 * start at XDP or at TC, go on at either, and go back to TC when the XDP
 * program is detached (an agent restart, a mode change).
 *
 * Both families: IPv4 in sl_ct_v2, IPv6 in sl_ct6_v1. What passes to TC
 * unchanged, counted by why (enum xdp_accel_decision): what is not IP, IPv4
 * options or IPv6 extension headers (a DSR option or header among them),
 * fragments, protocols other than TCP and UDP, a packet that starts no
 * flow here, a new flow the TC path starts (a frontend with local backends,
 * a host endpoint's policy, no endpoints), a flow the TC path
 * carries (a local backend, not SNATed nor by DSR, not allowed by its host
 * endpoint), a datagram the DSR option would make too big for its link, a
 * packet that changes its flow's state, an expiring TTL, and a next hop the
 * FIB does not resolve or an interface the frame cannot be sent to from
 * here (sl_xdpdev_v1). A new flow TC would refuse with a drop (a source
 * outside the ranges, no SNAT port, a full table) is dropped here, counted
 * and reported as TC does. */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "conntrack6.h"
#include "counters.h"
#include "ct_new.h"
#include "dsr.h"
#include "dsr6.h"
#include "events.h"
#include "hook.h"
#include "ifstate.h"
#include "parse.h"
#include "ipv6.h"
#include "rewrite.h"
#include "rewrite6.h"
#include "events6.h"
#include "service.h"
#include "service6.h"
#include "svcstats.h"

/* Each packet the acceleration sees is counted once, by its decision. */
enum xdp_accel_decision : __u32 {
	XDP_ACCEL_TX = 0,		/* translated, sent back out the interface it came in by */
	XDP_ACCEL_REDIRECTED,		/* translated, sent out another accelerated interface */
	XDP_ACCEL_PASS_NOT_IP,		/* ARP or another protocol: to TC */
	XDP_ACCEL_PASS_SHAPE,		/* IPv4 options, IPv6 extension headers, a
					 * fragment, not TCP or UDP, truncated */
	XDP_ACCEL_PASS_NO_FLOW,		/* no conntrack entry, and not a flow XDP starts: not
					 * a SYN or a datagram, no external frontend */
	XDP_ACCEL_PASS_TC_FLOW,		/* a flow the TC path carries: local backend,
					 * not SNATed, not entered from outside, not allowed */
	XDP_ACCEL_PASS_STATE,		/* a packet that changes its flow's state */
	XDP_ACCEL_PASS_TTL,		/* the TTL (hop limit) expires here: the stack answers it */
	XDP_ACCEL_PASS_FIB,		/* no next hop: no route, no neighbour, too big (the DSR
					 * option included), local */
	XDP_ACCEL_PASS_EGRESS,		/* the next hop is behind an interface XDP cannot send on */
	XDP_ACCEL_PASS_NEW_AT_TC,	/* a new flow the TC path starts: a frontend with local
					 * backends or local-only, no endpoints, a host
					 * endpoint's policy, no node address to SNAT to */
	XDP_ACCEL_DROPPED,		/* a new flow refused here, counted by why as TC counts
					 * it: a source outside the ranges, no SNAT port, a
					 * full table */
	XDP_ACCEL_MAX,
};

/* Per-CPU counts of each decision: one array lookup a packet (the version
 * grows with the array, as sl_counters_v*'s). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XDP_ACCEL_MAX);
	__type(key, enum xdp_accel_decision);
	__type(value, __u64);
} sl_xdpstats_v2 SEC(".maps");

/* The interfaces a translated frame may be redirected to: data interfaces
 * where the acceleration is attached in driver mode, written by the agent
 * (keyed and valued by ifindex). A driver sends a redirected frame only when
 * it implements XDP transmission; a frame whose next hop is elsewhere (a
 * workload's veth, an interface in generic mode) passes to TC untranslated. */
struct {
	__uint(type, BPF_MAP_TYPE_DEVMAP_HASH);
	__uint(max_entries, SL_IFSTATE_MAX);
	__type(key, __u32);
	__type(value, __u32);
} sl_xdpdev_v1 SEC(".maps");

static __always_inline int xdp_accel_count(enum xdp_accel_decision d, int action)
{
	enum xdp_accel_decision key = d;
	__u64 *n = bpf_map_lookup_elem(&sl_xdpstats_v2, &key);

	if (n)
		*n += 1;
	return action;
}

/* xdp_accel_flow tells whether an entry's packets may be carried here: a
 * flow from outside to a backend elsewhere, not refused by its host
 * endpoint (a reply is never judged), SNATed (both directions), or sent by
 * DSR where dsr says so (its forward direction: the replies do not come
 * back here). */
static __always_inline int xdp_accel_flow(enum ct_flags flags, enum ct_type type, enum pol_verdict pol_egress, int dsr)
{
	if (dsr && (flags & (CT_FROM_HOST | CT_BACKEND_LOCAL | CT_DSR)) == (CT_FROM_HOST | CT_DSR))
		return type == CT_FORWARD && pol_egress == POL_ALLOWED;
	if ((flags & (CT_FROM_HOST | CT_SNAT | CT_BACKEND_LOCAL | CT_DSR)) != (CT_FROM_HOST | CT_SNAT))
		return 0;
	return type == CT_REVERSE || pol_egress == POL_ALLOWED;
}

/* xdp_accel_steady tells whether a packet leaves its flow's state as it is,
 * so that ct_touch would only refresh last_seen: a TCP segment with no
 * SYN, FIN or RST whose direction has been acknowledged before, or a
 * datagram of a direction seen before. */
static __always_inline int xdp_accel_steady(__u32 tcp_seen, __u8 proto, __u8 tcp_flags)
{
	if (proto == IPPROTO_TCP)
		return !(tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)) && (tcp_seen & TCP_FLAG_ACK);
	return tcp_seen & CT_SEEN_PACKET;
}

/* xdp_accel_l4 finds a TCP or UDP header's checksum and TCP's flags; 0 when
 * the header is cut short. */
static __always_inline __sum16 *xdp_accel_l4(void *l4, void *data_end, __u8 proto, __u8 *tcp_flags)
{
	if (proto == IPPROTO_TCP) {
		struct tcphdr *tcp = l4;
		if ((void *)(tcp + 1) > data_end)
			return 0;
		*tcp_flags = ((__u8 *)tcp)[13];
		return &tcp->check;
	}
	struct udphdr *udp = l4;
	if ((void *)(udp + 1) > data_end)
		return 0;
	return &udp->check;
}

/* xdp_hop is the FIB's answer a frame is sent by: the next hop's and the
 * egress interface's MACs and the interface. Kept apart from the question
 * (struct bpf_fib_lookup), whose bytes the verifier's 512 then need only
 * while it is asked. */
struct xdp_hop {
	__u8 dmac[ETH_ALEN];
	__u8 smac[ETH_ALEN];
	__u32 ifindex;
};

/* xdp_accel_next_hop asks the FIB before anything is written (a packet it
 * does not resolve passes to TC as it came) and tells whether the frame can
 * be sent from here: back out the interface it came in by, or to one in
 * sl_xdpdev_v1. */
static __always_inline int xdp_accel_next_hop(struct xdp_md *ctx, struct bpf_fib_lookup *fib, struct xdp_hop *hop)
{
	if (bpf_fib_lookup(ctx, fib, sizeof(*fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_ACCEL_PASS_FIB;
	if (fib->ifindex != ctx->ingress_ifindex && !bpf_map_lookup_elem(&sl_xdpdev_v1, &fib->ifindex))
		return XDP_ACCEL_PASS_EGRESS;
	__builtin_memcpy(hop->dmac, fib->dmac, ETH_ALEN);
	__builtin_memcpy(hop->smac, fib->smac, ETH_ALEN);
	hop->ifindex = fib->ifindex;
	return XDP_ACCEL_TX;
}

/* xdp_accel_send writes the next hop's addresses and sends the frame. */
static __always_inline int xdp_accel_send(struct xdp_md *ctx, struct ethhdr *eth, const struct xdp_hop *hop)
{
	__builtin_memcpy(eth->h_dest, hop->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, hop->smac, ETH_ALEN);
	if (hop->ifindex == ctx->ingress_ifindex)
		return xdp_accel_count(XDP_ACCEL_TX, XDP_TX);
	xdp_accel_count(XDP_ACCEL_REDIRECTED, 0);
	return bpf_redirect_map(&sl_xdpdev_v1, hop->ifindex, 0);
}

/* xdp_accel_write4 writes an IPv4 translation as ct_apply and fib_forward
 * would: the addresses and ports, the TTL one less, both checksums
 * updated by the differences (the addresses in the IP header and L4's
 * pseudo header, the ports in L4, the TTL in IP: it shares a 16-bit word
 * with the protocol). */
static __always_inline void xdp_accel_write4(struct iphdr *ip, __be16 *l4, __sum16 *l4_check, __be32 saddr, __be32 daddr,
					     __u32 ports)
{
	__u64 addrs = word_diff(ip->saddr, saddr) + word_diff(ip->daddr, daddr);
	__u32 old_ports;
	__builtin_memcpy(&old_ports, l4, 4);
	__u64 port_diff = word_diff(old_ports, ports);
	__u16 old_ttl_word = *(__u16 *)&ip->ttl;
	ip->ttl -= 1;
	__u16 new_ttl_word = *(__u16 *)&ip->ttl;
	ip->check = csum_fold((__u16)~ip->check + addrs + word_diff(old_ttl_word, new_ttl_word));
	ip->saddr = saddr;
	ip->daddr = daddr;
	*l4_check = l4_check_updated(*l4_check, SKB_CHECKSUM_NONE, ip->protocol, addrs, port_diff);
	__builtin_memcpy(l4, &ports, 4);
}

/* xdp_dsr_push4 inserts the DSR option carrying the frontend (front_addr,
 * front_port) after a 20-byte IPv4 header, as dsr_push4 does at TC: the
 * frame grows at its head, and its Ethernet and IP headers move to the new
 * start. 0 when done; otherwise the frame is as it was. */
static __always_inline int xdp_dsr_push4(struct xdp_md *ctx, __be32 front_addr, __be16 front_port)
{
	if (bpf_xdp_adjust_head(ctx, -DSR_OPT_LEN))
		return -1;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ip_dsr4 *h = data + sizeof(*eth);

	if ((void *)(h + 1) > data_end) {
		bpf_xdp_adjust_head(ctx, DSR_OPT_LEN);
		return -1;
	}
	/* The headers as they were, DSR_OPT_LEN bytes on from the new start:
	 * read whole before they are written over. */
	struct ethhdr old_eth = *(struct ethhdr *)(data + DSR_OPT_LEN);
	struct iphdr old_ip = *(struct iphdr *)(data + DSR_OPT_LEN + sizeof(*eth));
	*eth = old_eth;
	h->ip = old_ip;
	h->ip.ihl = DSR_IHL;
	h->ip.tot_len = bpf_htons(bpf_ntohs(old_ip.tot_len) + DSR_OPT_LEN);
	h->ip.check = 0;
	h->opt.type = DSR_OPT_TYPE;
	h->opt.len = DSR_OPT_LEN;
	h->opt.port = front_port;
	h->opt.addr = front_addr;
	h->ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)h, sizeof(*h), 0));
	count(CNT_DSR_SENT);
	return 0;
}

/* xdp_accel_finish4 writes an IPv4 translation and sends the frame, its
 * headers found again (after a helper that may move them); opt: the DSR
 * option sits between the IP header and L4. */
static __always_inline int xdp_accel_finish4(struct xdp_md *ctx, int opt, __be32 saddr, __be32 daddr, __u32 ports,
					     const struct xdp_hop *hop)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	__be16 *l4 = (void *)(ip + 1) + (opt ? DSR_OPT_LEN : 0);
	__u8 unused;

	if ((void *)(ip + 1) > data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	__sum16 *l4_check = xdp_accel_l4(l4, data_end, ip->protocol, &unused);
	if (!l4_check)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	xdp_accel_write4(ip, l4, l4_check, saddr, daddr, ports);
	return xdp_accel_send(ctx, eth, hop);
}

/* xdp_accel_refuse drops a new flow that the TC path would drop too,
 * counted (c) and reported (a drop event) as the TC path does. */
static __always_inline int xdp_accel_refuse(struct xdp_md *ctx, enum counter c, const struct packet *p)
{
	drop(c);
	ev_drop4(ctx->ingress_ifindex, HOOK_FROM_HOST, p);
	return xdp_accel_count(XDP_ACCEL_DROPPED, XDP_DROP);
}

/* xdp_accel_refuse6 is xdp_accel_refuse for an IPv6 flow. */
static __always_inline int xdp_accel_refuse6(struct xdp_md *ctx, enum counter c, const struct packet6 *p6)
{
	drop(c);
	ev_drop6(ctx->ingress_ifindex, HOOK_FROM_HOST, p6);
	return xdp_accel_count(XDP_ACCEL_DROPPED, XDP_DROP);
}

/* xdp_accel_host_policy tells whether the data interface has a host
 * endpoint whose policy may judge a new flow (host_ingress_slot): the TC
 * path hands the flow to it. */
static __always_inline int xdp_accel_host_policy(struct xdp_md *ctx)
{
	struct ifstate_key k = { .ifindex = ctx->ingress_ifindex };
	struct ifstate_value *st = bpf_map_lookup_elem(&sl_ifstate_v1, &k);

	return st && st->egress_policy != IFSTATE_NO_POLICY;
}

/* XDP_ACCEL_START_FLOW: xdp_accel_v4's answer for a frame of the shape it
 * carries whose tuple sl_ct_v2 does not hold; xdp_accel then calls
 * xdp_accel_new4, in a frame beside xdp_accel_v4's rather than below it
 * (the verifier's 512 bytes hold the chain of frames). */
#define XDP_ACCEL_START_FLOW 0x10000

/* xdp_accel_new4 starts a flow that no entry of sl_ct_v2 knows, as
 * new_flow starts it at TC from a data interface, when its frontend is
 * external and all its backends are on other nodes, and sends its first
 * packet on; any other new flow passes to TC before anything is written. A
 * frontend with a local backend is TC's whole: a pick here that fell on
 * the local one could not be handed over (TC would pick again). */
__subprog int xdp_accel_new4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	__be16 *l4 = (void *)(ip + 1);
	__u8 tcp_flags = 0;

	/* xdp_accel_v4 checked the shape; the verifier asks again. */
	if ((void *)(ip + 1) > data_end || !xdp_accel_l4(l4, data_end, ip->protocol, &tcp_flags))
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	struct packet p = {
		.l3_off = sizeof(*eth), .l4_off = sizeof(*eth) + sizeof(*ip),
		.saddr = ip->saddr, .daddr = ip->daddr, .sport = l4[0], .dport = l4[1],
		.ip_len = bpf_ntohs(ip->tot_len), .proto = ip->protocol, .tcp_flags = tcp_flags, .ttl = ip->ttl,
	};
	/* A flow a resize's previous table holds is bridged by TC. (The key in
	 * a scope of its own: its bytes are ct_create's later, within the
	 * verifier's 512.) */
	{
		struct ct_key key;
		ct_key_of(&p, &key);
		if (ct_from_previous(&key))
			return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	}
	/* Only a connection's first segment starts a flow (TC: moved_flow for
	 * the rest); a datagram does, unless a takeover is adopting
	 * netfilter's flows. */
	if (p.proto == IPPROTO_TCP ? (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN : adopting())
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	struct fe_value *fe = fe_lookup(p.daddr, p.dport, p.proto);
	if (!fe || !(fe->flags & FE_EXTERNAL))
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	if (!src_allowed(fe, p.saddr))
		return xdp_accel_refuse(ctx, CNT_DROP_SRC_RANGE, &p);
	struct config *cfg = config_get();
	int dsr = dsr_wanted(cfg, &p);
	if (fe->local_count || (fe->flags & (FE_INT_LOCAL | FE_EXT_LOCAL)) || !cfg || (!dsr && !cfg->node_ip) ||
	    xdp_accel_host_policy(ctx))
		return xdp_accel_count(XDP_ACCEL_PASS_NEW_AT_TC, XDP_PASS);
	if (p.ttl <= 1)
		return xdp_accel_count(XDP_ACCEL_PASS_TTL, XDP_PASS);
	struct be_value be = {};
	__u32 ordinal = 0;
	if (pick_backend(fe, p.saddr, p.sport, 1, 0, &be, &ordinal) != PICK_OK || (be.flags & BE_LOCAL))
		return xdp_accel_count(XDP_ACCEL_PASS_NEW_AT_TC, XDP_PASS);

	/* The next hop before anything is written (snat_source: external
	 * traffic to another node leaves from the node's address; by DSR,
	 * with the client's, the option making it longer). */
	__be32 snat_addr = dsr ? 0 : cfg->node_ip;
	struct xdp_hop hop;
	{
		struct bpf_fib_lookup fib = {
			.family = 2, /* AF_INET */
			.l4_protocol = p.proto,
			.sport = p.sport,
			.dport = be.port,
			.tot_len = p.ip_len + (dsr ? DSR_OPT_LEN : 0),
			.ipv4_src = dsr ? p.saddr : snat_addr,
			.ipv4_dst = be.addr,
			.ifindex = ctx->ingress_ifindex,
		};
		enum xdp_accel_decision next = xdp_accel_next_hop(ctx, &fib, &hop);
		if (next != XDP_ACCEL_TX)
			return xdp_accel_count(next, XDP_PASS);
	}
	/* The option goes in first, as new_flow's: a packet that cannot take
	 * it passes to TC as it came, before any entry is written. */
	if (dsr && xdp_dsr_push4(ctx, p.daddr, p.dport))
		return xdp_accel_count(XDP_ACCEL_PASS_NEW_AT_TC, XDP_PASS);

	__u8 flags = CT_FROM_HOST | (dsr ? CT_DSR : CT_SNAT) | (is_host_ip(p.daddr) ? CT_NODE_SOURCE : 0);
	__be16 sport;
	int err = ct_create(&p, fe->svc_id, &be, &snat_addr, cfg, &flags, POL_ALLOWED, &sport);
	if (err)
		return xdp_accel_refuse(ctx, err == -E2BIG ? CNT_DROP_CT_FULL : CNT_DROP_SNAT_PORTS, &p);
	if (ev_flow_events())
		ev_flow4(ctx->ingress_ifindex, &p, HOOK_FROM_HOST, fe->svc_id, &be);
	svcstats_count(fe->svc_id, &p, 0, 1);
	/* A clash remaps a DSR flow's port, with the client's address kept
	 * (ct_create: CT_SNAT, snat_addr the client's). */
	return xdp_accel_finish4(ctx, dsr, snat_addr ? snat_addr : p.saddr, be.addr, tuple_ports(sport, be.port), &hop);
}

/* xdp_accel_v4: an IPv4 frame, after the prefilter let it through. */
__subprog int xdp_accel_v4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	/* Both L4 headers start with their ports; the checksum is TCP's 17th
	 * byte and UDP's 7th. */
	__be16 *l4 = (void *)(ip + 1);

	if ((void *)(ip + 1) > data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	if (ip->ihl != 5 || (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
	    (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP))
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	__u8 tcp_flags = 0;
	__sum16 *l4_check = xdp_accel_l4(l4, data_end, ip->protocol, &tcp_flags);
	if (!l4_check)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);

	struct ct_key key = { .saddr = ip->saddr, .daddr = ip->daddr, .proto = ip->protocol };
	__builtin_memcpy(&key.sport, l4, 4);
	struct ct_value *v = bpf_map_lookup_elem(&sl_ct_v2, &key);
	if (!v)
		return XDP_ACCEL_START_FLOW;
	if (!xdp_accel_flow(v->flags, v->type, v->pol_egress, 1))
		return xdp_accel_count(XDP_ACCEL_PASS_TC_FLOW, XDP_PASS);
	if (!xdp_accel_steady(v->tcp_seen, ip->protocol, tcp_flags))
		return xdp_accel_count(XDP_ACCEL_PASS_STATE, XDP_PASS);
	if (ip->ttl <= 1)
		return xdp_accel_count(XDP_ACCEL_PASS_TTL, XDP_PASS);

	/* The tuple as ct_apply writes it: a forward entry's packets go to the
	 * backend from the SNAT address and port, a reverse entry's come from
	 * the frontend to the client. */
	__be32 saddr, daddr;
	__u32 ports;
	if (v->type == CT_FORWARD) {
		/* A DSR flow keeps the client's address (its port too, unless a
		 * clash remapped it: CT_SNAT, with the client's address). */
		saddr = (v->flags & CT_SNAT) ? v->snat_addr : ip->saddr;
		daddr = v->nat_addr;
		ports = tuple_ports(v->snat_port, v->nat_port);
	} else {
		saddr = v->nat_addr;
		daddr = v->snat_addr;
		ports = tuple_ports(v->nat_port, v->snat_port);
	}
	/* Each datagram of a UDP flow by DSR carries the option (dsr.h). */
	int opt = (v->flags & CT_DSR) && ip->protocol == IPPROTO_UDP;

	/* The next hop before anything is written: a packet the FIB does not
	 * resolve, or that the option would make too big for its link, passes
	 * to TC as it came. */
	struct bpf_fib_lookup fib = {
		.family = 2, /* AF_INET */
		.l4_protocol = ip->protocol,
		.sport = (__be16)ports,
		.dport = (__be16)(ports >> 16),
		.tot_len = bpf_ntohs(ip->tot_len) + (opt ? DSR_OPT_LEN : 0),
		.ipv4_src = saddr,
		.ipv4_dst = daddr,
		.ifindex = ctx->ingress_ifindex,
	};
	struct xdp_hop hop;
	enum xdp_accel_decision next = xdp_accel_next_hop(ctx, &fib, &hop);
	if (next != XDP_ACCEL_TX)
		return xdp_accel_count(next, XDP_PASS);

	/* The packet is forwarded: the entry sees it as ct_touch would, and the
	 * Service counts it as the TC path does. */
	struct packet p = { .proto = ip->protocol, .tcp_flags = tcp_flags, .ip_len = bpf_ntohs(ip->tot_len) };
	ct_touch(v, &p);
	if (v->svc_id)
		svcstats_count(v->svc_id, &p, v->type == CT_REVERSE, 0);

	if (opt) {
		if (xdp_dsr_push4(ctx, ip->daddr, l4[1]))
			return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
		return xdp_accel_finish4(ctx, 1, saddr, daddr, ports, &hop);
	}
	xdp_accel_write4(ip, l4, l4_check, saddr, daddr, ports);
	return xdp_accel_send(ctx, eth, &hop);
}

/* xdp_accel_write6 writes an IPv6 translation as ct6_apply and the stack's
 * forwarding would: the addresses and ports, the hop limit one less. No
 * header checksum in IPv6: the addresses (addrs, L4's pseudo header) and
 * the ports change the L4 checksum only. */
static __always_inline void xdp_accel_write6(struct ip6_raw *ip6, __be16 *l4, __sum16 *l4_check, __u8 proto, __u64 addrs,
					     const __u8 *saddr, const __u8 *daddr, __u32 ports)
{
	__u32 old_ports;
	__builtin_memcpy(&old_ports, l4, 4);
	__u64 port_diff = word_diff(old_ports, ports);
	ip6->hop_limit -= 1;
	__builtin_memcpy(ip6->saddr, saddr, 16);
	__builtin_memcpy(ip6->daddr, daddr, 16);
	*l4_check = l4_check_updated(*l4_check, SKB_CHECKSUM_NONE, proto, addrs, port_diff);
	__builtin_memcpy(l4, &ports, 4);
}

/* xdp_dsr_push6 inserts the DSR destination options header naming the
 * frontend after the IPv6 header, as dsr6_push does at TC: the frame grows
 * at its head, and its Ethernet and IPv6 headers move to the new start. 0
 * when done; otherwise the frame is as it was. A subprogram, beneath the
 * established path's frame. */
__subprog int xdp_dsr_push6(struct xdp_md *ctx, const __u8 *front_addr, __be16 front_port)
{
	if (bpf_xdp_adjust_head(ctx, -DSR6_HDR_LEN))
		return -1;
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ip_dsr6 *h = data + sizeof(struct ethhdr);

	if ((void *)(h + 1) > data_end) {
		bpf_xdp_adjust_head(ctx, DSR6_HDR_LEN);
		return -1;
	}
	/* Two bytes at a time from the front (the header lands 2-byte
	 * aligned): each pair is read before the copy, DSR6_HDR_LEN bytes
	 * behind, writes over it. Volatile, so that the compiler keeps each
	 * load beside its store rather than hoisting them all to the stack. */
	volatile __u16 *to = data, *from = data + DSR6_HDR_LEN;
#pragma unroll
	for (int i = 0; i < (ETH_HLEN + IPV6_HLEN) / 2; i++)
		to[i] = from[i];
	h->opt.nexthdr = h->ip.nexthdr;
	h->opt.hdrlen = DSR6_HDR_LEN / 8 - 1;
	h->opt.type = DSR6_OPT_TYPE;
	h->opt.len = sizeof(h->opt.addr) + sizeof(h->opt.port);
	const __u16 *addr = (const void *)front_addr;
	volatile __u16 *opt_addr = (void *)h->opt.addr;
#pragma unroll
	for (int i = 0; i < 8; i++)
		opt_addr[i] = addr[i];
	h->opt.port = front_port;
	h->opt.pad_type = 1;
	h->opt.pad_len = 0;
	h->ip.nexthdr = NEXTHDR_DEST;
	h->ip.payload_len = bpf_htons(bpf_ntohs(h->ip.payload_len) + DSR6_HDR_LEN);
	count(CNT_DSR_SENT);
	return 0;
}

/* xdp_accel_send_pushed sends a frame whose head a push moved (or tried
 * to): its Ethernet header is read again from the frame as it is now. */
static __always_inline int xdp_accel_send_pushed(struct xdp_md *ctx, const struct xdp_hop *hop)
{
	struct ethhdr *eth = (void *)(long)ctx->data;

	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	return xdp_accel_send(ctx, eth, hop);
}

/* xdp_accel_send_new_dsr6 inserts the header naming the frontend (p6's
 * destination: the packet as it came) into a new flow's translated first
 * packet and sends it, as pipeline6 inserts it once the entries are
 * written: a first packet that cannot take it is dropped, as there (the
 * backend's node could not answer the flow). A subprogram beside
 * xdp_accel_new6's callees: that frame is at the verifier's bound. */
__subprog int xdp_accel_send_new_dsr6(struct xdp_md *ctx, const struct packet6 *p6, const struct xdp_hop *hop)
{
	if (xdp_dsr_push6(ctx, p6->daddr, p6->p.dport))
		return xdp_accel_refuse6(ctx, CNT_DROP_DSR_FAILED, p6);
	return xdp_accel_send_pushed(ctx, hop);
}

/* xdp_accel_new6: xdp_accel_new4 for an IPv6 frame, as new_flow6 starts
 * the flow at TC, on sl_ct6_v1. */
__subprog int xdp_accel_new6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ip6_raw *ip6 = data + sizeof(*eth);
	__be16 *l4 = (void *)(ip6 + 1);
	__u8 tcp_flags = 0;

	if ((void *)(ip6 + 1) > data_end || !xdp_accel_l4(l4, data_end, ip6->nexthdr, &tcp_flags))
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	struct packet6 p6 = {
		.p = {
			.l3_off = sizeof(*eth), .l4_off = sizeof(*eth) + IPV6_HLEN,
			.sport = l4[0], .dport = l4[1], .proto = ip6->nexthdr, .tcp_flags = tcp_flags,
			.ip_len = IPV6_HLEN + bpf_ntohs(ip6->payload_len), .ttl = ip6->hop_limit,
		},
	};
	__builtin_memcpy(p6.saddr, ip6->saddr, 16);
	__builtin_memcpy(p6.daddr, ip6->daddr, 16);
	struct packet *p = &p6.p;
	struct ct6_key key = { .sport = p->sport, .dport = p->dport, .proto = p->proto };
	__builtin_memcpy(key.saddr, p6.saddr, 16);
	__builtin_memcpy(key.daddr, p6.daddr, 16);

	if (ct6_from_previous(&key))
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	if (p->proto == IPPROTO_TCP ? (tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN : adopting())
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	struct fe_value *fe = fe6_lookup(p6.daddr, p->dport, p->proto);
	if (!fe || !(fe->flags & FE_EXTERNAL))
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	if (!src_allowed6(fe, p6.saddr))
		return xdp_accel_refuse6(ctx, CNT_DROP_SRC_RANGE, &p6);
	struct config *cfg = config_get();
	struct config6 *cfg6 = config6_get();
	/* DSR as new_flow6's: where the first packet can carry the header
	 * (dsr6_fits), else SNATed. */
	int dsr = dsr_wanted(cfg, p) && dsr6_fits(p);
	if (fe->local_count || (fe->flags & (FE_INT_LOCAL | FE_EXT_LOCAL)) || !cfg6 ||
	    (!dsr && addr6_is_zero(cfg6->node_ip)) || xdp_accel_host_policy(ctx))
		return xdp_accel_count(XDP_ACCEL_PASS_NEW_AT_TC, XDP_PASS);
	if (p->ttl <= 1)
		return xdp_accel_count(XDP_ACCEL_PASS_TTL, XDP_PASS);
	struct be6_value be = {};
	__u32 ordinal = 0;
	if (pick_backend6(fe, p6.saddr, p->sport, 1, 0, &be, &ordinal) != PICK_OK || (be.flags & BE_LOCAL))
		return xdp_accel_count(XDP_ACCEL_PASS_NEW_AT_TC, XDP_PASS);

	/* The source the flow leaves with: the node's, or by DSR the client's
	 * (which ct6_create's remap of a clash keeps too). */
	__u8 snat_addr[16];
	addr6_copy(snat_addr, dsr ? p6.saddr : cfg6->node_ip);
	struct xdp_hop hop;
	{
		struct bpf_fib_lookup fib = {
			.family = 10, /* AF_INET6 */
			.l4_protocol = p->proto,
			.sport = p->sport,
			.dport = be.port,
			.tot_len = p->ip_len + (dsr ? DSR6_HDR_LEN : 0),
			.ifindex = ctx->ingress_ifindex,
		};
		__builtin_memcpy(fib.ipv6_src, snat_addr, 16);
		__builtin_memcpy(fib.ipv6_dst, be.addr, 16);
		enum xdp_accel_decision next = xdp_accel_next_hop(ctx, &fib, &hop);
		if (next != XDP_ACCEL_TX)
			return xdp_accel_count(next, XDP_PASS);
	}

	__u8 flags = CT_FROM_HOST | (dsr ? CT_DSR : CT_SNAT) | (is_host_ip6(p6.daddr) ? CT_NODE_SOURCE : 0);
	int snat = !dsr;
	__be16 sport;
	int err = ct6_create(&p6, &key, fe->svc_id, &be, &snat, snat_addr, &flags, POL_ALLOWED, &sport);
	if (err)
		return xdp_accel_refuse6(ctx, err == -E2BIG ? CNT_DROP_CT_FULL : CNT_DROP_SNAT_PORTS, &p6);
	if (ev_flow_events())
		ev_flow_start6(ctx->ingress_ifindex, &key, HOOK_FROM_HOST);
	svcstats_count(fe->svc_id, p, 0, 1);

	data = (void *)(long)ctx->data;
	data_end = (void *)(long)ctx->data_end;
	eth = data;
	ip6 = data + sizeof(*eth);
	l4 = (void *)(ip6 + 1);
	if ((void *)(ip6 + 1) > data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	__u8 unused;
	__sum16 *l4_check = xdp_accel_l4(l4, data_end, ip6->nexthdr, &unused);
	if (!l4_check)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	__u64 addrs = addr6_diff((__u16 *)ip6->saddr, snat_addr) + addr6_diff((__u16 *)ip6->daddr, be.addr);
	xdp_accel_write6(ip6, l4, l4_check, p->proto, addrs, snat_addr, be.addr, tuple_ports(sport, be.port));
	if (!dsr)
		return xdp_accel_send(ctx, eth, &hop);
	return xdp_accel_send_new_dsr6(ctx, &p6, &hop);
}

/* xdp_accel_send_dsr6 inserts the DSR header into a translated datagram
 * and sends it; one that could not take it goes without, as at TC (the
 * backend's node has the flow from an earlier datagram). */
static __always_inline int xdp_accel_send_dsr6(struct xdp_md *ctx, const __u8 *front_addr, __be16 front_port,
					       const struct xdp_hop *hop)
{
	xdp_dsr_push6(ctx, front_addr, front_port);
	return xdp_accel_send_pushed(ctx, hop);
}

/* xdp_accel_v6: an IPv6 frame, after the prefilter let it through; what
 * xdp_accel_v4 does, on sl_ct6_v1. Any extension header passes to TC (a
 * fragment header, DSR's destination option among them). */
__subprog int xdp_accel_v6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ip6_raw *ip6 = data + sizeof(*eth);
	__be16 *l4 = (void *)(ip6 + 1);

	if ((void *)(ip6 + 1) > data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	if (ip6->nexthdr != IPPROTO_TCP && ip6->nexthdr != IPPROTO_UDP)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	__u8 proto = ip6->nexthdr, tcp_flags = 0;
	__sum16 *l4_check = xdp_accel_l4(l4, data_end, proto, &tcp_flags);
	if (!l4_check)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);

	struct ct6_key key = { .proto = proto };
	__builtin_memcpy(key.saddr, ip6->saddr, 16);
	__builtin_memcpy(key.daddr, ip6->daddr, 16);
	__builtin_memcpy(&key.sport, l4, 4);
	struct ct6_value *v = bpf_map_lookup_elem(&sl_ct6_v1, &key);
	if (!v)
		return XDP_ACCEL_START_FLOW;
	if (!xdp_accel_flow(v->flags, v->type, v->pol_egress, 1))
		return xdp_accel_count(XDP_ACCEL_PASS_TC_FLOW, XDP_PASS);
	if (!xdp_accel_steady(v->tcp_seen, proto, tcp_flags))
		return xdp_accel_count(XDP_ACCEL_PASS_STATE, XDP_PASS);
	if (ip6->hop_limit <= 1)
		return xdp_accel_count(XDP_ACCEL_PASS_TTL, XDP_PASS);

	/* The tuple as ct6_apply writes it (xdp_accel_v4), written straight
	 * into the FIB's question, where it is read from again. */
	__u32 ip_len = IPV6_HLEN + bpf_ntohs(ip6->payload_len);
	/* Each datagram of a UDP flow by DSR carries the header where it fits
	 * (dsr6.h); one that does not goes without it, as at TC. */
	int opt = (v->flags & CT_DSR) && proto == IPPROTO_UDP && ip_len + DSR6_HDR_LEN <= DSR6_MAX_LEN;
	struct bpf_fib_lookup fib = {
		.family = 10, /* AF_INET6 */
		.l4_protocol = proto,
		.tot_len = ip_len + (opt ? DSR6_HDR_LEN : 0),
		.ifindex = ctx->ingress_ifindex,
	};
	__u32 ports;
	if (v->type == CT_FORWARD) {
		/* A DSR flow keeps the client's address (xdp_accel_v4). */
		__builtin_memcpy(fib.ipv6_src, (v->flags & CT_SNAT) ? v->snat_addr : ip6->saddr, 16);
		__builtin_memcpy(fib.ipv6_dst, v->nat_addr, 16);
		ports = tuple_ports(v->snat_port, v->nat_port);
	} else {
		__builtin_memcpy(fib.ipv6_src, v->nat_addr, 16);
		__builtin_memcpy(fib.ipv6_dst, v->snat_addr, 16);
		ports = tuple_ports(v->nat_port, v->snat_port);
	}
	fib.sport = (__be16)ports;
	fib.dport = (__be16)(ports >> 16);
	/* The checksum's difference and the new addresses, kept before the
	 * FIB answers into the same structure (a gateway's address replaces
	 * the destination). */
	__u64 addrs = addr6_diff((__u16 *)ip6->saddr, (__u8 *)fib.ipv6_src) +
		      addr6_diff((__u16 *)ip6->daddr, (__u8 *)fib.ipv6_dst);
	__u8 saddr[16], daddr[16];
	__builtin_memcpy(saddr, fib.ipv6_src, 16);
	__builtin_memcpy(daddr, fib.ipv6_dst, 16);
	struct xdp_hop hop;
	enum xdp_accel_decision next = xdp_accel_next_hop(ctx, &fib, &hop);
	if (next != XDP_ACCEL_TX)
		return xdp_accel_count(next, XDP_PASS);

	struct packet p = { .proto = proto, .tcp_flags = tcp_flags, .ip_len = ip_len > 0xffff ? 0xffff : ip_len };
	ct6_touch(v, &p);
	if (v->svc_id)
		svcstats_count(v->svc_id, &p, v->type == CT_REVERSE, 0);

	xdp_accel_write6(ip6, l4, l4_check, proto, addrs, saddr, daddr, ports);
	if (opt)
		return xdp_accel_send_dsr6(ctx, key.daddr, key.dport, &hop);
	return xdp_accel_send(ctx, eth, &hop);
}

/* xdp_accel: the acceleration, by family. Each family a subprogram: a
 * stack frame of its own, beside the prefilter's. */
static __always_inline int xdp_accel(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;

	if ((void *)(eth + 1) > data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_NOT_IP, XDP_PASS);
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		int verdict = xdp_accel_v4(ctx);
		return verdict == XDP_ACCEL_START_FLOW ? xdp_accel_new4(ctx) : verdict;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		int verdict = xdp_accel_v6(ctx);
		return verdict == XDP_ACCEL_START_FLOW ? xdp_accel_new6(ctx) : verdict;
	}
	return xdp_accel_count(XDP_ACCEL_PASS_NOT_IP, XDP_PASS);
}
