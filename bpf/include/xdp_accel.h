/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* XDP acceleration of external flows: an established packet of a flow that
 * entered from outside and is SNATed to a backend on another node (a
 * NodePort, LoadBalancer or externalIP flow, and its replies) is translated
 * and sent on from the driver, before an skb exists.
 *
 * It uses the TC path's conntrack entries as they are: the TC path creates
 * a flow (its first packet finds no entry here and passes), the packets
 * that change its state (a SYN, a FIN, a RST, the first ACK of a direction,
 * a datagram's first answer) pass to it too, and everything in between is
 * translated here exactly as ct_apply would, with the FIB's next hop as
 * fib_forward would choose it. So a flow may start at TC and go on at XDP,
 * or go back to TC when the XDP program is detached (an agent restart, a
 * mode change): both read and write the same entries.
 *
 * Both families: IPv4 in sl_ct_v2, IPv6 in sl_ct6_v1. What passes to TC
 * unchanged, counted by why (enum xdp_accel_decision): what is not IP, IPv4
 * options or IPv6 extension headers (a DSR option or header among them),
 * fragments, protocols other than TCP and UDP, a miss, a flow
 * the TC path handles otherwise (a local backend, DSR, not SNATed, not
 * allowed by its host endpoint), a packet that changes its flow's state, an
 * expiring TTL, and a next hop the FIB does not resolve or an interface the
 * frame cannot be sent to from here (sl_xdpdev_v1). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "conntrack6.h"
#include "counters.h"
#include "parse.h"
#include "ipv6.h"
#include "rewrite.h"
#include "rewrite6.h"
#include "svcstats.h"

/* Each packet the acceleration sees is counted once, by its decision. */
enum xdp_accel_decision : __u32 {
	XDP_ACCEL_TX = 0,		/* translated, sent back out the interface it came in by */
	XDP_ACCEL_REDIRECTED,		/* translated, sent out another accelerated interface */
	XDP_ACCEL_PASS_NOT_IP,		/* ARP or another protocol: to TC */
	XDP_ACCEL_PASS_SHAPE,		/* IPv4 options, IPv6 extension headers, a
					 * fragment, not TCP or UDP, truncated */
	XDP_ACCEL_PASS_NO_FLOW,		/* no conntrack entry: a new flow, or none of ours */
	XDP_ACCEL_PASS_TC_FLOW,		/* a flow the TC path carries: local backend, DSR,
					 * not SNATed, not entered from outside, not allowed */
	XDP_ACCEL_PASS_STATE,		/* a packet that changes its flow's state */
	XDP_ACCEL_PASS_TTL,		/* the TTL (hop limit) expires here: the stack answers it */
	XDP_ACCEL_PASS_FIB,		/* no next hop: no route, no neighbour, too big, local */
	XDP_ACCEL_PASS_EGRESS,		/* the next hop is behind an interface XDP cannot send on */
	XDP_ACCEL_MAX,
};

/* Per-CPU counts of each decision: one array lookup a packet. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, XDP_ACCEL_MAX);
	__type(key, enum xdp_accel_decision);
	__type(value, __u64);
} sl_xdpstats_v1 SEC(".maps");

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
	__u64 *n = bpf_map_lookup_elem(&sl_xdpstats_v1, &key);

	if (n)
		*n += 1;
	return action;
}

/* xdp_accel_flow tells whether an entry's packets may be carried here: a
 * flow from outside, SNATed, to a backend elsewhere, neither by DSR (whose
 * datagrams carry an option, and whose replies do not come back) nor refused
 * by its host endpoint (a reply is never judged). */
static __always_inline int xdp_accel_flow(enum ct_flags flags, enum ct_type type, enum pol_verdict pol_egress)
{
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

/* xdp_accel_next_hop asks the FIB before anything is written (a packet it
 * does not resolve passes to TC as it came) and tells whether the frame can
 * be sent from here: back out the interface it came in by, or to one in
 * sl_xdpdev_v1. */
static __always_inline int xdp_accel_next_hop(struct xdp_md *ctx, struct bpf_fib_lookup *fib)
{
	if (bpf_fib_lookup(ctx, fib, sizeof(*fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return XDP_ACCEL_PASS_FIB;
	if (fib->ifindex != ctx->ingress_ifindex && !bpf_map_lookup_elem(&sl_xdpdev_v1, &fib->ifindex))
		return XDP_ACCEL_PASS_EGRESS;
	return XDP_ACCEL_TX;
}

/* xdp_accel_send writes the next hop's addresses and sends the frame. */
static __always_inline int xdp_accel_send(struct xdp_md *ctx, struct ethhdr *eth, const struct bpf_fib_lookup *fib)
{
	__builtin_memcpy(eth->h_dest, fib->dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib->smac, ETH_ALEN);
	if (fib->ifindex == ctx->ingress_ifindex)
		return xdp_accel_count(XDP_ACCEL_TX, XDP_TX);
	xdp_accel_count(XDP_ACCEL_REDIRECTED, 0);
	return bpf_redirect_map(&sl_xdpdev_v1, fib->ifindex, 0);
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
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	if (!xdp_accel_flow(v->flags, v->type, v->pol_egress))
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
		saddr = v->snat_addr;
		daddr = v->nat_addr;
		ports = tuple_ports(v->snat_port, v->nat_port);
	} else {
		saddr = v->nat_addr;
		daddr = v->snat_addr;
		ports = tuple_ports(v->nat_port, v->snat_port);
	}

	/* The next hop before anything is written: a packet the FIB does not
	 * resolve passes to TC as it came. */
	struct bpf_fib_lookup fib = {
		.family = 2, /* AF_INET */
		.l4_protocol = ip->protocol,
		.sport = (__be16)ports,
		.dport = (__be16)(ports >> 16),
		.tot_len = bpf_ntohs(ip->tot_len),
		.ipv4_src = saddr,
		.ipv4_dst = daddr,
		.ifindex = ctx->ingress_ifindex,
	};
	enum xdp_accel_decision hop = xdp_accel_next_hop(ctx, &fib);
	if (hop != XDP_ACCEL_TX)
		return xdp_accel_count(hop, XDP_PASS);

	/* The packet is forwarded: the entry sees it as ct_touch would, and the
	 * Service counts it as the TC path does. */
	struct packet p = { .proto = ip->protocol, .tcp_flags = tcp_flags, .ip_len = bpf_ntohs(ip->tot_len) };
	ct_touch(v, &p);
	if (v->svc_id)
		svcstats_count(v->svc_id, &p, v->type == CT_REVERSE, 0);

	/* The differences the checksums take: the addresses (in the IP header
	 * and L4's pseudo header), the ports (L4), the TTL (IP: it shares a
	 * 16-bit word with the protocol). */
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
	return xdp_accel_send(ctx, eth, &fib);
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
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	if (!xdp_accel_flow(v->flags, v->type, v->pol_egress))
		return xdp_accel_count(XDP_ACCEL_PASS_TC_FLOW, XDP_PASS);
	if (!xdp_accel_steady(v->tcp_seen, proto, tcp_flags))
		return xdp_accel_count(XDP_ACCEL_PASS_STATE, XDP_PASS);
	if (ip6->hop_limit <= 1)
		return xdp_accel_count(XDP_ACCEL_PASS_TTL, XDP_PASS);

	/* The tuple as ct6_apply writes it (xdp_accel_v4), written straight
	 * into the FIB's question, where it is read from again. */
	__u32 ip_len = IPV6_HLEN + bpf_ntohs(ip6->payload_len);
	struct bpf_fib_lookup fib = {
		.family = 10, /* AF_INET6 */
		.l4_protocol = proto,
		.tot_len = ip_len,
		.ifindex = ctx->ingress_ifindex,
	};
	__u32 ports;
	if (v->type == CT_FORWARD) {
		__builtin_memcpy(fib.ipv6_src, v->snat_addr, 16);
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
	enum xdp_accel_decision hop = xdp_accel_next_hop(ctx, &fib);
	if (hop != XDP_ACCEL_TX)
		return xdp_accel_count(hop, XDP_PASS);

	struct packet p = { .proto = proto, .tcp_flags = tcp_flags, .ip_len = ip_len > 0xffff ? 0xffff : ip_len };
	ct6_touch(v, &p);
	if (v->svc_id)
		svcstats_count(v->svc_id, &p, v->type == CT_REVERSE, 0);

	/* No header checksum in IPv6: the addresses (L4's pseudo header) and
	 * the ports change the L4 checksum only. */
	__u32 old_ports;
	__builtin_memcpy(&old_ports, l4, 4);
	__u64 port_diff = word_diff(old_ports, ports);
	ip6->hop_limit -= 1;
	__builtin_memcpy(ip6->saddr, saddr, 16);
	__builtin_memcpy(ip6->daddr, daddr, 16);
	*l4_check = l4_check_updated(*l4_check, SKB_CHECKSUM_NONE, proto, addrs, port_diff);
	__builtin_memcpy(l4, &ports, 4);
	return xdp_accel_send(ctx, eth, &fib);
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
	if (eth->h_proto == bpf_htons(ETH_P_IP))
		return xdp_accel_v4(ctx);
	if (eth->h_proto == bpf_htons(ETH_P_IPV6))
		return xdp_accel_v6(ctx);
	return xdp_accel_count(XDP_ACCEL_PASS_NOT_IP, XDP_PASS);
}
