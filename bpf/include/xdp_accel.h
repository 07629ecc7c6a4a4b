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
 * What passes to TC unchanged, counted by why (enum xdp_accel_decision):
 * what is not IPv4 (IPv6 is not accelerated yet), IP options (a DSR option
 * among them), fragments, protocols other than TCP and UDP, a miss, a flow
 * the TC path handles otherwise (a local backend, DSR, not SNATed, not
 * allowed by its host endpoint), a packet that changes its flow's state, an
 * expiring TTL, and a next hop the FIB does not resolve or an interface the
 * frame cannot be sent to from here (sl_xdpdev_v1). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "counters.h"
#include "parse.h"
#include "rewrite.h"
#include "svcstats.h"

/* Each packet the acceleration sees is counted once, by its decision. */
enum xdp_accel_decision : __u32 {
	XDP_ACCEL_TX = 0,		/* translated, sent back out the interface it came in by */
	XDP_ACCEL_REDIRECTED,		/* translated, sent out another accelerated interface */
	XDP_ACCEL_PASS_NOT_IPV4,	/* IPv6 or another protocol: to TC */
	XDP_ACCEL_PASS_SHAPE,		/* IP options, a fragment, not TCP or UDP, truncated */
	XDP_ACCEL_PASS_NO_FLOW,		/* no conntrack entry: a new flow, or none of ours */
	XDP_ACCEL_PASS_TC_FLOW,		/* a flow the TC path carries: local backend, DSR,
					 * not SNATed, not entered from outside, not allowed */
	XDP_ACCEL_PASS_STATE,		/* a packet that changes its flow's state */
	XDP_ACCEL_PASS_TTL,		/* the TTL expires here: the stack answers it */
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
static __always_inline int xdp_accel_flow(const struct ct_value *v)
{
	if ((v->flags & (CT_FROM_HOST | CT_SNAT | CT_BACKEND_LOCAL | CT_DSR)) != (CT_FROM_HOST | CT_SNAT))
		return 0;
	return v->type == CT_REVERSE || v->pol_egress == POL_ALLOWED;
}

/* xdp_accel_steady tells whether a packet leaves its flow's state as it is,
 * so that ct_touch would only refresh last_seen: a TCP segment with no
 * SYN, FIN or RST whose direction has been acknowledged before, or a
 * datagram of a direction seen before. */
static __always_inline int xdp_accel_steady(const struct ct_value *v, __u8 proto, __u8 tcp_flags)
{
	if (proto == IPPROTO_TCP)
		return !(tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_FIN | TCP_FLAG_RST)) && (v->tcp_seen & TCP_FLAG_ACK);
	return v->tcp_seen & CT_SEEN_PACKET;
}

/* xdp_accel_v4: an IPv4 frame, after the prefilter let it through. */
static __always_inline int xdp_accel_v4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	/* Both L4 headers start with their ports; the checksum is TCP's 17th
	 * byte and UDP's 7th. */
	__be16 *l4 = (void *)(ip + 1);

	if ((void *)(eth + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP))
		return xdp_accel_count(XDP_ACCEL_PASS_NOT_IPV4, XDP_PASS);
	if ((void *)(ip + 1) > data_end)
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	if (ip->ihl != 5 || (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)) ||
	    (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP))
		return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
	__sum16 *l4_check;
	__u8 tcp_flags = 0;
	if (ip->protocol == IPPROTO_TCP) {
		struct tcphdr *tcp = (void *)l4;
		if ((void *)(tcp + 1) > data_end)
			return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
		tcp_flags = ((__u8 *)tcp)[13];
		l4_check = &tcp->check;
	} else {
		struct udphdr *udp = (void *)l4;
		if ((void *)(udp + 1) > data_end)
			return xdp_accel_count(XDP_ACCEL_PASS_SHAPE, XDP_PASS);
		l4_check = &udp->check;
	}

	struct ct_key key = { .saddr = ip->saddr, .daddr = ip->daddr, .proto = ip->protocol };
	__builtin_memcpy(&key.sport, l4, 4);
	struct ct_value *v = bpf_map_lookup_elem(&sl_ct_v2, &key);
	if (!v)
		return xdp_accel_count(XDP_ACCEL_PASS_NO_FLOW, XDP_PASS);
	if (!xdp_accel_flow(v))
		return xdp_accel_count(XDP_ACCEL_PASS_TC_FLOW, XDP_PASS);
	if (!xdp_accel_steady(v, ip->protocol, tcp_flags))
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
	if (bpf_fib_lookup(ctx, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_SUCCESS)
		return xdp_accel_count(XDP_ACCEL_PASS_FIB, XDP_PASS);
	int tx = fib.ifindex == ctx->ingress_ifindex;
	if (!tx && !bpf_map_lookup_elem(&sl_xdpdev_v1, &fib.ifindex))
		return xdp_accel_count(XDP_ACCEL_PASS_EGRESS, XDP_PASS);

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
	__builtin_memcpy(eth->h_dest, fib.dmac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, fib.smac, ETH_ALEN);

	if (tx)
		return xdp_accel_count(XDP_ACCEL_TX, XDP_TX);
	xdp_accel_count(XDP_ACCEL_REDIRECTED, 0);
	return bpf_redirect_map(&sl_xdpdev_v1, fib.ifindex, 0);
}
