/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The XDP prefilter on data interfaces: packets from source CIDRs in the deny
 * list (sl_prefilter_v1) are dropped at the driver, before conntrack or NAT.
 *
 * Failsafe rule: a packet from a denied source still passes when it is TCP or
 * UDP, carries its L4 header (not a non-first fragment), and its destination
 * port is in sl_failsafe_v1 for its protocol (by default TCP 22, 6443, 10256),
 * so a bad deny list cannot lock the operator out. Every other packet from a
 * denied source is dropped (ICMP included). Packets from other sources, of
 * other protocols than IPv4 and IPv6, and malformed packets pass unchanged to
 * the TC path.
 *
 * IPv6 sources are looked up in sl_prefilter6_v1. Its failsafe rule reads the
 * ports of a TCP or UDP header right after the IPv6 header: a denied source's
 * packet with extension headers is dropped, failsafe port or not (the
 * prefilter does not walk them). */
#pragma once

#include "common.h"
#include "consts.h"
#include "counters.h"
#include "ipv6.h"
#include "parse.h"

struct prefilter_key {
	__u32 prefixlen;	/* host order: 0..32 (LPM trie prefix) */
	__be32 addr;		/* network order: the CIDR's address */
};
ASSERT_SIZE(struct prefilter_key, 8);

struct prefilter_value {
	__u32 flags;		/* host order: reserved, 0 */
};
ASSERT_SIZE(struct prefilter_value, 4);

struct failsafe_key {
	__u8 proto;		/* IPPROTO_TCP / IPPROTO_UDP */
	__u8 pad;		/* 0 */
	__be16 port;		/* network order: inbound destination port */
};
ASSERT_SIZE(struct failsafe_key, 4);

struct failsafe_value {
	__u32 flags;		/* host order: reserved, 0 */
};
ASSERT_SIZE(struct failsafe_value, 4);

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_PREFILTER_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct prefilter_key);
	__type(value, struct prefilter_value);
} sl_prefilter_v1 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_FAILSAFE_MAX);
	__type(key, struct failsafe_key);
	__type(value, struct failsafe_value);
} sl_failsafe_v1 SEC(".maps");

struct prefilter6_key {
	__u32 prefixlen;	/* host order: 0..128 (LPM trie prefix) */
	__u8 addr[16];		/* network order: the CIDR's address */
};
ASSERT_SIZE(struct prefilter6_key, 20);

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, SL_PREFILTER_MAX);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct prefilter6_key);
	__type(value, struct prefilter_value);
} sl_prefilter6_v1 SEC(".maps");

/* failsafe_port: the packet's L4 ports at ports are to a failsafe port. */
static __always_inline int failsafe_port(__u8 proto, const __be16 *ports)
{
	struct failsafe_key fk = { .proto = proto, .port = ports[1] };

	if (!bpf_map_lookup_elem(&sl_failsafe_v1, &fk))
		return 0;
	count(CNT_XDP_PASS_FAILSAFE);
	return 1;
}

/* prefilter6: the prefilter for an IPv6 frame. A subprogram: its key's
 * bytes are then not in the frame of the XDP entry program, beneath which
 * the acceleration's flow creation needs nearly all of the verifier's 512. */
__subprog int prefilter6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ip6_raw *ip = data + sizeof(struct ethhdr);

	if ((void *)(ip + 1) > data_end)
		return XDP_PASS;
	/* The source as a /128: the trie answers with the longest denied
	 * prefix that holds it. */
	struct prefilter6_key key = { .prefixlen = 128 };
	addr6_copy(key.addr, ip->saddr);
	if (!bpf_map_lookup_elem(&sl_prefilter6_v1, &key))
		return XDP_PASS;
	if (ip->nexthdr == IPPROTO_TCP || ip->nexthdr == IPPROTO_UDP) {
		__be16 *ports = (void *)(ip + 1);
		if ((void *)(ports + 2) <= data_end && failsafe_port(ip->nexthdr, ports))
			return XDP_PASS;
	}
	count(CNT_XDP_DROP_DENIED);
	return XDP_DROP;
}

static __always_inline int prefilter(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);

	if ((void *)(eth + 1) <= data_end && eth->h_proto == bpf_htons(ETH_P_IPV6))
		return prefilter6(ctx);
	if ((void *)(ip + 1) > data_end || eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl < 5)
		return XDP_PASS;
	/* The source as a /32: the trie answers with the longest denied prefix
	 * that holds it. */
	struct prefilter_key key = { .prefixlen = 32, .addr = ip->saddr };
	if (!bpf_map_lookup_elem(&sl_prefilter_v1, &key))
		return XDP_PASS;

	if ((ip->protocol == IPPROTO_TCP || ip->protocol == IPPROTO_UDP) &&
	    !(ip->frag_off & bpf_htons(IP_OFFSET))) {
		__be16 *ports = (void *)ip + ip->ihl * 4;
		/* source and destination port */
		if ((void *)(ports + 2) <= data_end && failsafe_port(ip->protocol, ports))
			return XDP_PASS;
	}
	count(CNT_XDP_DROP_DENIED);
	return XDP_DROP;
}
