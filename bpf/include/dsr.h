/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Direct server return for external traffic to a backend on another node.
 *
 * Without it, a NodePort or LoadBalancer flow from outside to a remote
 * backend is SNATed to the balancing node's address, so the backend never
 * sees the client and every reply comes back through that node. With
 * --external-service-mode=dsr (TCP and UDP) or hybrid (TCP only; UDP stays
 * SNATed), the balancing node DNATs the flow to the backend and keeps the
 * client's address; the backend's node answers the client itself, from the
 * frontend's address.
 *
 * The carrier: the frontend's address and port ride in an IPv4 option
 * (DSR_OPT_TYPE, 8 bytes) on the packet sent to the backend's node. The
 * packet stays a plain packet to the backend, routed by the routes the
 * cluster already has (no tunnel device, no outer header), and only the
 * packets that may start the flow at the backend's node carry it: a TCP
 * flow's first packet at the balancing node (its SYN, or the first segment
 * of a connection that moved here), every UDP datagram (each may be the first
 * one the backend's node sees after its entry expired). So the option costs
 * nothing on an established TCP connection, and MSS is untouched.
 *
 * Balancing node (new_flow, and the established path for UDP): dsr_push4
 * inserts the option after the IPv4 header. A packet that no longer fits the
 * link to the backend's node (checked by the FIB for packets over 1280
 * bytes) is answered with "fragmentation needed" at the link's MTU less the
 * option, quoting the packet as the client sent it, so the client's path MTU
 * discovery works through the balancing node; a packet without DF is
 * fragmented by the stack (the option's copy bit puts it in each fragment).
 * This node's entries carry CT_DSR: the scanner judges their flows by the
 * forward direction alone, since no reply passes here.
 *
 * Backend's node (pipeline, on a data interface's ingress): dsr_pull4 finds
 * the option, removes it (the backend sees a plain packet) and, when the
 * flow is new here, writes a pair of entries: the forward one passes the
 * packets untranslated, the reverse one gives the replies the frontend's
 * address and port as source (CT_DSR | CT_BACKEND_LOCAL), and the replies
 * are then routed by the FIB (the node's stack would refuse a packet from a
 * pod's interface with another node's address as source). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "counters.h"
#include "csum.h"
#include "parse.h"
#include "rewrite.h"

/* RFC 4727's experimental option number 30, with the copy bit (copied into
 * every fragment) and class 0: 0x9e. */
#define DSR_OPT_TYPE	0x9e
#define DSR_OPT_LEN	8
/* IPv4 header length, in 32-bit words, with the option and nothing else. */
#define DSR_IHL		((sizeof(struct iphdr) + DSR_OPT_LEN) / 4)
/* Packets up to this length fit every link the cluster's nodes use, so the
 * option needs no FIB lookup to check its room. */
#define DSR_NO_CHECK_LEN 1280

struct dsr_opt4 {
	__u8 type;		/* DSR_OPT_TYPE */
	__u8 len;		/* DSR_OPT_LEN */
	__be16 port;		/* network order: the frontend's port */
	__be32 addr;		/* network order: the frontend's address */
};
ASSERT_SIZE(struct dsr_opt4, DSR_OPT_LEN);

struct ip_dsr4 {
	struct iphdr ip;
	struct dsr_opt4 opt;
};

/* dsr_wanted: whether a new flow from outside to a frontend goes to its
 * remote backend by DSR rather than SNAT. */
static __always_inline int dsr_wanted(const struct config *cfg, const struct packet *p)
{
	return cfg && (cfg->flags & (p->proto == IPPROTO_TCP ? CFG_DSR_TCP : p->proto == IPPROTO_UDP ? CFG_DSR_UDP : 0));
}

/* dsr_room4: whether a packet to be_addr still fits its link with the
 * option: 0 if so, else the MTU the client must use. Only a packet with DF
 * set is answered; the stack fragments the others. */
static __always_inline __u32 dsr_room4(struct __sk_buff *skb, const struct packet *p, const struct iphdr *ip,
				       __be32 be_addr)
{
	if (p->ip_len + DSR_OPT_LEN <= DSR_NO_CHECK_LEN || !(ip->frag_off & bpf_htons(IP_DF)))
		return 0;
	struct bpf_fib_lookup fib = {
		.family = 2, /* AF_INET */
		.l4_protocol = p->proto,
		.tot_len = p->ip_len + DSR_OPT_LEN,
		.ipv4_src = p->saddr,
		.ipv4_dst = be_addr,
		.ifindex = skb->ifindex,
	};
	if (bpf_fib_lookup(skb, &fib, sizeof(fib), 0) != BPF_FIB_LKUP_RET_FRAG_NEEDED ||
	    fib.mtu_result <= DSR_OPT_LEN + 68 /* IPv4's minimum MTU */)
		return 0;
	return fib.mtu_result - DSR_OPT_LEN;
}

/* dsr_push4 inserts the option carrying the packet's destination (the
 * frontend, before DNAT) after its IPv4 header. It returns 0 when done, -1
 * when the packet could not take it, or the MTU to tell the client when the
 * packet would no longer fit the link to be_addr (nothing is changed then).
 * A packet that carries IP options of its own is sent without one. */
__subprog int dsr_push4(struct __sk_buff *skb, struct packet *p, __be32 be_addr)
{
	struct ip_dsr4 h;

	if (bpf_skb_load_bytes(skb, p->l3_off, &h.ip, sizeof(h.ip)))
		return -1;
	if (h.ip.ihl != 5)
		return -1;
	__u32 mtu = dsr_room4(skb, p, &h.ip, be_addr);
	if (mtu)
		return mtu;
	/* The room opens right after the 20-byte header (BPF_ADJ_ROOM_NET). */
	if (bpf_skb_adjust_room(skb, DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0))
		return -1;
	h.ip.ihl = DSR_IHL;
	h.ip.tot_len = bpf_htons(p->ip_len + DSR_OPT_LEN);
	h.ip.check = 0;
	h.opt.type = DSR_OPT_TYPE;
	h.opt.len = DSR_OPT_LEN;
	h.opt.port = p->dport;
	h.opt.addr = p->daddr;
	h.ip.check = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&h, sizeof(h), 0));
	if (bpf_skb_store_bytes(skb, p->l3_off, &h, sizeof(h), 0))
		return -1;
	p->l4_off += DSR_OPT_LEN;
	p->ip_len += DSR_OPT_LEN;
	count(CNT_DSR_SENT);
	return 0;
}

/* dsr_too_big turns a packet into the "fragmentation needed" that tells its
 * client the MTU it must use, quoting the packet as the client sent it, and
 * sends it back out of the interface it came in by. */
__subprog int dsr_too_big(struct __sk_buff *skb, const struct packet *p, __u32 mtu)
{
	struct {
		struct iphdr ip;
		struct icmphdr icmp;
		__u8 quote[sizeof(struct iphdr) + 8];
	} reply = {};
	const __u32 grow = sizeof(reply.ip) + sizeof(reply.icmp);

	if (bpf_skb_load_bytes(skb, p->l3_off, reply.quote, sizeof(reply.quote)))
		return drop(CNT_DROP_DSR_FAILED);
	reply.icmp.type = ICMP_DEST_UNREACH;
	reply.icmp.code = ICMP_FRAG_NEEDED;
	reply.icmp.un.frag.mtu = bpf_htons(mtu);
	reply.icmp.checksum = csum_fold(bpf_csum_diff(NULL, 0, (__be32 *)&reply.icmp,
						      sizeof(reply.icmp) + sizeof(reply.quote), 0));
	reply.ip.version = 4;
	reply.ip.ihl = 5;
	reply.ip.tot_len = bpf_htons(sizeof(reply));
	reply.ip.ttl = 64;
	reply.ip.protocol = IPPROTO_ICMP;
	reply.ip.saddr = p->daddr;
	reply.ip.daddr = p->saddr;
	reply.ip.check = ipv4_hdr_csum(&reply.ip);
	if (bpf_skb_adjust_room(skb, grow, BPF_ADJ_ROOM_MAC, 0) ||
	    bpf_skb_change_tail(skb, p->l3_off + sizeof(reply), 0) ||
	    bpf_skb_store_bytes(skb, p->l3_off, &reply, sizeof(reply), 0) ||
	    (p->l3_off && swap_eth(skb)))
		return drop(CNT_DROP_DSR_FAILED);
	count(CNT_DSR_TOO_BIG);
	return bpf_redirect(skb->ifindex, 0);
}

/* dsr_track writes the backend's node's entries of a flow that arrived with
 * a DSR option: forward (the packet's tuple, untranslated) and reverse (the
 * reply's tuple, to leave from the frontend). The option is authoritative:
 * a SYN replaces whatever the tuple held (a connection that ended, or a flow
 * tracked untranslated), so a client reopening a port through the Service is
 * answered from the Service. A reverse key held by another live flow is a
 * clash no port remap can solve (the client's address and port are what the
 * backend sees): that packet is dropped, counted. */
static __always_inline int dsr_track(struct packet *p, const struct dsr_opt4 *opt)
{
	__u64 now = sl_now();
	struct ct_key fwd_key, rev_key = {
		.saddr = p->daddr, .daddr = p->saddr, .sport = p->dport, .dport = p->sport, .proto = p->proto,
	};

	ct_key_of(p, &fwd_key);
	int syn = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	struct ct_value *known = bpf_map_lookup_elem(&sl_ct_v2, &fwd_key);
	if (known && !syn && (known->flags & CT_DSR))
		return 0;
	struct ct_value v = {
		.created = now, .last_seen = now, .peer = fwd_key,
		.nat_addr = opt->addr, .nat_port = opt->port,
		.type = CT_REVERSE, .flags = CT_DSR | CT_FROM_HOST | CT_BACKEND_LOCAL, .pol_egress = POL_ALLOWED,
	};
	int err = bpf_map_update_elem(&sl_ct_v2, &rev_key, &v, BPF_NOEXIST);
	if (err == -E2BIG)
		return -E2BIG;
	if (err) {
		struct ct_value *held = bpf_map_lookup_elem(&sl_ct_v2, &rev_key);
		if (!held || held->type != CT_REVERSE || held->peer.saddr != p->saddr || held->peer.sport != p->sport ||
		    held->peer.daddr != p->daddr || held->peer.dport != p->dport ||
		    bpf_map_update_elem(&sl_ct_v2, &rev_key, &v, BPF_ANY))
			return -1;
	}
	v.peer = rev_key;
	v.nat_addr = p->daddr;
	v.nat_port = p->dport;
	v.tcp_seen = p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK);
	v.type = CT_FORWARD;
	if ((err = bpf_map_update_elem(&sl_ct_v2, &fwd_key, &v, BPF_ANY))) {
		bpf_map_delete_elem(&sl_ct_v2, &rev_key);
		return err == -E2BIG ? -E2BIG : -1;
	}
	return 0;
}

/* dsr_pull4: a packet from outside whose IPv4 header has options. When the
 * first is a DSR option (and the only one), it is removed and the flow
 * tracked (dsr_track); p then describes the packet without it. It returns 0
 * when done or when the packet carries no DSR option, or a drop. */
__subprog int dsr_pull4(struct __sk_buff *skb, struct packet *p)
{
	struct ip_dsr4 h;

	if (bpf_skb_load_bytes(skb, p->l3_off, &h, sizeof(h)) || h.ip.ihl != DSR_IHL ||
	    h.opt.type != DSR_OPT_TYPE || h.opt.len != DSR_OPT_LEN)
		return 0;
	if (bpf_skb_adjust_room(skb, -DSR_OPT_LEN, BPF_ADJ_ROOM_NET, 0))
		return drop(CNT_DROP_DSR_FAILED);
	h.ip.ihl = 5;
	h.ip.tot_len = bpf_htons(p->ip_len - DSR_OPT_LEN);
	h.ip.check = 0;
	h.ip.check = ipv4_hdr_csum(&h.ip);
	if (bpf_skb_store_bytes(skb, p->l3_off, &h.ip, sizeof(h.ip), 0))
		return drop(CNT_DROP_DSR_FAILED);
	p->l4_off -= DSR_OPT_LEN;
	p->ip_len -= DSR_OPT_LEN;
	count(CNT_DSR_ACCEPTED);
	/* A later fragment has no ports: its flow is the first fragment's. */
	if (p->l4_absent)
		return 0;
	int err = dsr_track(p, &h.opt);
	if (err)
		return drop_create_failed(err, 0);
	return 0;
}
