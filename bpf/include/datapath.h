/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The service datapath: parse -> conntrack -> service lookup -> NAT -> verdict.
 *
 * One pipeline serves the four TC hooks; the hook says where a packet is:
 *   HOOK_FROM_WL    ingress of a workload's host-side veth (leaving the pod)
 *   HOOK_TO_WL      egress of a workload's host-side veth (entering the pod)
 *   HOOK_FROM_HOST  ingress of a data interface (from outside the node)
 *   HOOK_TO_HOST    egress of a data interface (leaving the node)
 * New flows are balanced only where they enter (FROM_*); every hook applies
 * conntrack, so both directions of a flow are handled from conntrack alone.
 *
 * The stages live in their headers, in the order a packet meets them:
 *   parse        parse.h (fragments: frag.h)
 *   conntrack    conntrack.h (the layout, lookups), ct_new.h (flow creation
 *                and the clash rules)
 *   service      service.h (frontend lookup, source ranges, backend choice)
 *   NAT          rewrite.h (the SNAT decision, replaying a flow's
 *                translation, the checksum-safe writes, the store an
 *                established packet leaves to sl_write_span), dsr.h
 *                (direct server return to a remote backend, instead of SNAT)
 *   verdict      policy.h (which policy judges a flow, the hand-off to it),
 *                reject.h and icmp_error.h (answers the node writes itself),
 *                counters.h (drop)
 * This file joins them per hook: pipeline() at the bottom reads top-down,
 * and the functions above it are its branches. IPv6 packets leave it at
 * parse for pipeline6 (datapath6.h), the same stages on the IPv6 maps.
 *
 * Every stage returns a TC verdict, JUDGE_BY_POLICY or FORWARD_BY_FIB
 * (policy.h), or WRITE_SPAN (rewrite.h); the entry programs in sluice.c turn
 * the latter three into the tail calls and the FIB's redirect.
 *
 * Policy (policy.h): a workload's egress policy judges a new flow at
 * FROM_WL once its backend is chosen and NAT applied; its ingress policy at
 * TO_WL. The verdict is recorded on the flow's conntrack entries, so
 * established flows and replies are never judged again. */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack.h"
#include "ct_new.h"
#include "counters.h"
#include "dsr.h"
#include "events.h"
#include "frag.h"
#include "hook.h"
#include "icmp_error.h"
#include "ifstate.h"
#include "parse.h"
#include "policy.h"
#include "prefilter.h"
#include "reject.h"
#include "rewrite.h"
#include "service.h"
#include "svcnet.h"
#include "svcstats.h"

/* Local delivery (deliver.h): a packet leaving a workload for a workload of
 * this node goes to the destination's interface past the node's stack. The
 * established path asks it (deliver_flow) until a flow is marked as one the
 * stack routes; the entry program asks it for what else passes
 * (sl_from_wl). ROUTED_BY_STACK: "asked, and this packet passes to the
 * stack", which sl_from_wl turns into TC_ACT_OK. */
#define ROUTED_BY_STACK 0x50000
__subprog int deliver_local(struct __sk_buff *skb, __u32 *flow_seen);
__subprog int deliver_local6(struct __sk_buff *skb, __u32 *flow_seen);

/* deliver_flow: a packet of an established flow leaving a workload with
 * verdict; flow_seen is its conntrack entry's tcp_seen word. A flow marked
 * CT_SEEN_STACK_ROUTED (traffic to other nodes, to the node, out of the
 * cluster) pays a bit test, not local delivery's lookup. */
static __always_inline int deliver_flow(struct __sk_buff *skb, int verdict, __u32 *flow_seen, int ipv6)
{
	if (verdict != TC_ACT_OK)
		return verdict;
	if (*flow_seen & CT_SEEN_STACK_ROUTED)
		return ROUTED_BY_STACK;
	return ipv6 ? deliver_local6(skb, flow_seen) : deliver_local(skb, flow_seen);
}

/* stack_routed: the verdict on a workload's packet that no conntrack entry
 * knows and that starts no flow here (a TCP segment that is not a SYN, a
 * datagram while adopting): it goes to the node's stack, never to local
 * delivery. Such a packet may belong to a connection netfilter translated
 * (kube-proxy's, before this node was taken over, or one not adopted yet):
 * only the stack applies that translation, and its replies would otherwise
 * reach the client untranslated. */
static __always_inline int stack_routed(int verdict)
{
	return verdict == TC_ACT_OK ? ROUTED_BY_STACK : verdict;
}

/* The IPv6 pipeline (datapath6.h), which pipeline() hands IPv6 packets to. */
__subprog int pipeline6(struct __sk_buff *skb, enum hook hook, __u32 l2_len);
/* dsr6.h, which datapath6.h includes (bpf/sluice.c includes both pipelines). */
static __always_inline int dsr6_pull_first(struct __sk_buff *skb, const __u32 l2_len);

/* reject answers a new flow with a RST (TCP) or an ICMP port unreachable (UDP,
 * SCTP), counted under why. */
__subprog int reject(struct __sk_buff *skb, const struct packet *p, enum counter why)
{
	int err = p->proto == IPPROTO_TCP ? reject_tcp(skb, p) : reject_udp(skb, p);

	if (err)
		return drop(CNT_DROP_REJECT_FAILED);
	count(why);
	return bpf_redirect(skb->ifindex, 0);
}

/* ---- Host endpoints: policy on traffic to and from the node itself ---- */

/* failsafe: a flow to a port of the failsafe list (sl_failsafe_v1: SSH, the
 * API server, health checks) is never judged by a host endpoint's policy, so
 * a wrong host policy cannot lock the node out. */
static __always_inline int failsafe(const struct packet *p)
{
	struct failsafe_key k = { .proto = p->proto, .port = p->dport };

	return bpf_map_lookup_elem(&sl_failsafe_v1, &k) != NULL;
}

/* host_ingress_slot: the host endpoint policy that judges a new flow
 * entering through a data interface, or IFSTATE_NO_POLICY. to_node: the flow
 * is for the node itself or for a Service (judged before DNAT); traffic
 * forwarded to pods or elsewhere is not the host's and is not judged here. */
static __always_inline __u32 host_ingress_slot(struct __sk_buff *skb, const struct packet *p, int to_node)
{
	if (!to_node || failsafe(p))
		return IFSTATE_NO_POLICY;
	return policy_slot(skb, POLICY_DIR_EGRESS); /* the entry hook's slot */
}

/* track_flow tracks a flow that no Service translates, so that its tuple is
 * known to the clash check of later flows (and it gets a port of its own when
 * a flow already holds its tuple at the destination), and so that a policy's
 * verdict on its first packet holds for the rest of it. A later fragment of
 * a datagram whose flow is unknown starts nothing. */
__subprog int track_flow(struct __sk_buff *skb, struct packet *p, __u32 dir, __u32 slot)
{
	struct be_value self = { .addr = p->daddr, .port = p->dport };
	__be32 snat_addr = 0;
	__u8 flags = 0;
	__be16 sport;

	if (p->l4_absent)
		return TC_ACT_OK;
	int err = ct_create(p, 0, &self, &snat_addr, config_get(), &flags,
			    dir == POLICY_DIR_EGRESS && slot != IFSTATE_NO_POLICY ? POL_UNJUDGED : POL_ALLOWED, &sport);
	if (err)
		return drop_create_failed(err, snat_addr);
	if (snat_addr && (p->proto == IPPROTO_SCTP ? sctp_translate4(skb, p, snat_addr, p->daddr, tuple_ports(sport, p->dport))
					       : rewrite_src(skb, p, snat_addr, sport)))
		return drop(CNT_DROP_MALFORMED);
	if (slot == IFSTATE_NO_POLICY)
		return TC_ACT_OK;
	return policy_handoff(skb, p, dir, slot);
}

/* to_workload_new: a packet entering a workload that matched no conntrack
 * entry by its own tuple. By the reversed tuple it may be the forward
 * direction of a flow NATed on this node (its reverse entry), or a reply to a
 * flow the workload started after reverse NAT (a forward entry). Otherwise it
 * starts a flow the ingress policy judges. */
__subprog int to_workload_new(struct __sk_buff *skb, struct packet *p)
{
	struct ct_value *r = ct_lookup_reversed(p);

	if (r && r->type == CT_FORWARD)
		return TC_ACT_OK;
	/* A SYN on the tuple of a flow whose server has already answered is not
	 * that flow's SYN: another connection (from the node itself, or from an
	 * interface Sluice does not manage) on the same tuple, tracked and
	 * remapped as a flow of its own. */
	int syn = p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN;
	if (r && !(syn && (r->tcp_seen & TCP_FLAG_ACK)))
		return enforce(skb, p, r, POLICY_DIR_INGRESS);
	/* As at the other hooks, a TCP segment that is not a SYN starts no
	 * flow; nor does a datagram while a takeover is adopting netfilter's
	 * flows (CFG_ADOPTING): it may be one of them. */
	if ((p->proto == IPPROTO_TCP && !syn) || (p->proto == IPPROTO_UDP && !r && adopting()))
		return judge_stateless(skb, p, POLICY_DIR_INGRESS);
	return track_flow(skb, p, POLICY_DIR_INGRESS, policy_slot(skb, POLICY_DIR_INGRESS));
}

/* new_flow balances a new flow to a frontend. */
__subprog int new_flow(struct __sk_buff *skb, struct packet *p, enum hook hook, const struct fe_value *fe)
{
	int from_host = hook == HOOK_FROM_HOST;
	struct be_value be = {};
	__u32 ordinal = 0;

	if (!src_allowed(fe, p->saddr))
		return drop(CNT_DROP_SRC_RANGE);

	int local_only = (fe->flags & FE_INT_LOCAL) || (from_host && (fe->flags & FE_EXT_LOCAL));
	int picked = pick_backend(fe, p->saddr, p->sport, 1, local_only, &be, &ordinal);
	if (picked == PICK_BACKEND_MISSING) {
		/* This packet read the frontend just before a sync replaced it
		 * with a shorter one and deleted the backend it then chose (an
		 * updated hash entry is a new element; the old one stays
		 * readable). The syncer writes every frontend whole, so the
		 * current one names only backends that exist. */
		const struct fe_value *now = fe_lookup(p->daddr, p->dport, p->proto);
		if (now && now != fe) {
			fe = now;
			local_only = (fe->flags & FE_INT_LOCAL) || (from_host && (fe->flags & FE_EXT_LOCAL));
			picked = pick_backend(fe, p->saddr, p->sport, 1, local_only, &be, &ordinal);
		}
	}
	switch (picked) {
	case PICK_NO_ENDPOINTS:
		return reject(skb, p, CNT_REJECT_NO_ENDPOINTS);
	case PICK_NO_LOCAL:
		return drop(CNT_DROP_NO_LOCAL_BACKEND);
	case PICK_BACKEND_MISSING:
		return drop(CNT_DROP_BACKEND_MISSING);
	}

	struct config *cfg = config_get();
	/* External traffic to a remote backend goes by DSR where the node
	 * asks for it (dsr.h): the option goes in first, so that a packet it
	 * would make too big is answered before any entry is written. A packet
	 * that cannot carry it (options of its own) is SNATed as before. */
	int dsr = from_host && (fe->flags & FE_EXTERNAL) && !(be.flags & BE_LOCAL) && dsr_wanted(cfg, p);
	if (dsr) {
		int room = dsr_push4(skb, p, be.addr);
		if (room > 0)
			return dsr_too_big(skb, p, room);
		dsr = room == 0;
	}
	__be32 snat_addr = dsr ? 0 : snat_source(skb, p, fe, &be, from_host, cfg);
	__u8 flags = (from_host ? CT_FROM_HOST : 0) | ((be.flags & BE_LOCAL) ? CT_BACKEND_LOCAL : 0) |
		     (snat_addr ? CT_SNAT : 0) | (!from_host && be.addr == p->saddr ? CT_HAIRPIN : 0) |
		     (dsr ? CT_DSR : 0);
	/* A workload's packets of this flow may leave it with the node's
	 * address as source: SNATed to the node, or the replies of a flow to a
	 * node address (a NodePort) from a local backend. */
	if (!(flags & CT_HAIRPIN) && ((!from_host && snat_addr) || is_host_ip(p->daddr)))
		flags |= CT_NODE_SOURCE;

	/* Traffic from a workload waits for its egress policy; external
	 * traffic for its host endpoint's ingress policy, on the tuple it came
	 * with (before DNAT: Calico's pre-DNAT policy). */
	__u32 slot = from_host ? host_ingress_slot(skb, p, 1) : policy_slot(skb, POLICY_DIR_EGRESS);
	/* The tuple as it came, for a judgement before DNAT, goes to cb now
	 * (a copy on the stack would take the chain of calls over the
	 * verifier's 512 bytes). */
	if (from_host && slot != IFSTATE_NO_POLICY)
		policy_tuple_pre_nat(skb, p);
	__be16 sport;
	int err = ct_create(p, fe->svc_id, &be, &snat_addr, cfg, &flags,
			    slot == IFSTATE_NO_POLICY ? POL_ALLOWED : POL_UNJUDGED, &sport);
	if (err)
		return drop_create_failed(err, snat_addr);
	if (ev_flow_events())
		ev_flow4(skb->ifindex, p, hook, fe->svc_id, &be);
	if (rewrite_tuple(skb, p, snat_addr ? snat_addr : p->saddr, be.addr, tuple_ports(snat_addr ? sport : p->sport, be.port)))
		return drop(CNT_DROP_MALFORMED);
	svcstats_count(fe->svc_id, p, 0, 1);
	/* A workload's flow SNATed to the node (not to itself) is routed here:
	 * the stack would take its source for a spoof. So is external traffic
	 * SNATed to the node: the stack drops a packet that arrives with the
	 * node's own address as source (a martian). */
	int fib = (from_host || (flags & CT_NODE_SOURCE)) && snat_addr;
	if (slot == IFSTATE_NO_POLICY)
		return (flags & CT_HAIRPIN) ? hairpin_return(skb) : fib ? FORWARD_BY_FIB : TC_ACT_OK;
	if (from_host) {
		int verdict = policy_handoff_pre_nat(skb, p, POLICY_DIR_EGRESS, slot);
		/* fib_forward reads an Ethernet frame: an L3 device's packet
		 * is left to the stack (finish, sluice.c). */
		return fib && p->l3_off == ETH_HLEN ? fib_verdict(skb, verdict) : verdict;
	}
	/* A workload's egress is judged on the tuple the destination will see:
	 * after NAT. */
	int verdict = policy_handoff(skb, p, POLICY_DIR_EGRESS, slot);
	return (flags & CT_HAIRPIN) ? hairpin_verdict(skb, verdict) : fib ? fib_verdict(skb, verdict) : verdict;
}

/* portless_to_service_net: a packet of a protocol without ports entering
 * the node (an echo request to an address that is no service IP, GRE, ESP,
 * ...). Toward an address of a ServiceCIDR it is dropped, as kube-proxy's
 * cluster-ips-check drops it (and rejects it toward a ClusterIP, whose echo
 * requests the datapath answers instead); elsewhere it passes. */
static __always_inline int portless_to_service_net(__be32 daddr)
{
	if (svcnet_kind4(daddr) != SVCNET_NONE)
		return drop(CNT_DROP_UNALLOCATED_SERVICE_IP);
	return TC_ACT_OK;
}

__subprog int handle_icmp(struct __sk_buff *skb, struct packet *p, enum hook hook)
{
	switch (p->icmp_type) {
	case ICMP_ECHO: {
		/* Echo requests are judged packet by packet (ICMP has no conntrack);
		 * replies pass. */
		if (hook == HOOK_FROM_WL || hook == HOOK_TO_WL) {
			int verdict = judge_stateless(skb, p, hook == HOOK_FROM_WL ? POLICY_DIR_EGRESS : POLICY_DIR_INGRESS);
			if (verdict != TC_ACT_OK)
				return verdict;
		}
		struct fe_key key = { .addr = p->daddr, .proto = IPPROTO_ICMP };
		if (hook != HOOK_FROM_WL && hook != HOOK_FROM_HOST)
			return TC_ACT_OK;
		if (!bpf_map_lookup_elem(&sl_fe_v1, &key))
			return portless_to_service_net(p->daddr);
		if (answer_echo(skb, p))
			return drop(CNT_DROP_REJECT_FAILED);
		count(CNT_ICMP_ECHO_ANSWERED);
		return bpf_redirect(skb->ifindex, 0);
	}
	case ICMP_DEST_UNREACH:
	case ICMP_TIME_EXCEEDED:
		if (icmp_error_rnat(skb, p))
			return drop(CNT_DROP_MALFORMED);
		return TC_ACT_OK;
	}
	return TC_ACT_OK;
}

/* is_service_ip: the syncer marks every service IP with an ICMP frontend. */
static __always_inline int is_service_ip(__be32 addr)
{
	struct fe_key key = { .addr = addr, .proto = IPPROTO_ICMP };
	return bpf_map_lookup_elem(&sl_fe_v1, &key) != NULL;
}

/* unknown_fragment: a later fragment whose first fragment was not seen. It
 * must never reach a Service untranslated; other traffic passes as it is. */
static __always_inline int unknown_fragment(const struct packet *p)
{
	if (is_service_ip(p->daddr))
		return drop(CNT_DROP_FRAGMENT_UNKNOWN);
	count(CNT_PASS_FRAGMENT);
	return TC_ACT_OK;
}

/* untracked_fragment: a later fragment whose ports are known but whose flow
 * conntrack does not hold (its first fragment was dropped or rejected, or the
 * flow expired in between). It starts nothing: a fragment to a frontend is
 * dropped, one entering a workload is judged as its flow's first fragment
 * was, anything else passes. */
__subprog int untracked_fragment(struct __sk_buff *skb, struct packet *p, enum hook hook)
{
	if (hook == HOOK_TO_WL)
		return to_workload_new(skb, p);
	if (hook != HOOK_TO_HOST && fe_lookup(p->daddr, p->dport, p->proto))
		return drop(CNT_DROP_FRAGMENT_UNKNOWN);
	return TC_ACT_OK;
}

/* handled_upstream: a packet leaving through an egress hook that an ingress
 * hook of this node already handled (entered_managed). It was
 * translated there, once: its tuple now is the one the destination sees, and
 * a conntrack entry keyed by that tuple may belong to another flow (a direct
 * flow whose source port was remapped keeps its own, untranslated tuple as
 * its key). The one key that names this packet's flow is the reversed tuple,
 * the flow's reverse entry, unique on the node by construction (ct_create);
 * a hit there that is a forward entry makes this packet a reply. So nothing
 * is translated here: a workload's ingress policy judges the flow on its
 * reverse entry, and everything else passes. */
__subprog int handled_upstream(struct __sk_buff *skb, struct packet *p, enum hook hook)
{
	if (hook != HOOK_TO_WL)
		return TC_ACT_OK;
	struct ct_value *r = ct_lookup_reversed(p);
	if (r)
		return r->type == CT_FORWARD ? TC_ACT_OK : enforce(skb, p, r, POLICY_DIR_INGRESS);
	if (p->l4_absent)
		return TC_ACT_OK;
	return judge_stateless(skb, p, POLICY_DIR_INGRESS);
}

/* host_new_flow_out: a packet leaving through a data interface that no
 * conntrack entry knows and no managed interface handled. When it starts a
 * flow of the node's own (a local socket's TCP SYN or datagram, no ingress
 * interface), the flow is tracked, as netfilter tracks a node's
 * connections: its tuple is then known to the clash rules, so that no
 * SNATed flow draws a port it holds toward the same destination, and it
 * gets a port of its own when a translated flow holds its tuple there
 * already (its replies would be taken for that flow's); and with a host
 * endpoint on the interface its first packet is judged by the endpoint's
 * egress policy (failsafe ports excepted), its replies passing by conntrack.
 * Anything else leaves as it is. */
__subprog int host_new_flow_out(struct __sk_buff *skb, struct packet *p)
{
	/* The cheap tests first: most of what the node sends is established
	 * TCP, which must not pay for the interface-state lookup. */
	if (skb->ingress_ifindex ||
	    (p->proto == IPPROTO_TCP && (p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN))
		return TC_ACT_OK;
	/* A local socket's flow to an address of a ServiceCIDR that no
	 * Service holds (the socket hooks translated nothing): dropped, as
	 * kube-proxy's output chain does (svcnet.h). */
	if (skb->sk && svcnet_kind4(p->daddr) == SVCNET_RANGE)
		return drop(CNT_DROP_UNALLOCATED_SERVICE_IP);
	struct ifstate_key k = { .ifindex = skb->ifindex };
	struct ifstate_value *st = bpf_map_lookup_elem(&sl_ifstate_v1, &k);

	/* The exit hook's slot (ifstate.h): the host endpoint's egress. */
	if (st && (st->ingress_policy != IFSTATE_NO_POLICY || st->egress_policy != IFSTATE_NO_POLICY))
		return track_flow(skb, p, POLICY_DIR_INGRESS, failsafe(p) ? IFSTATE_NO_POLICY : st->ingress_policy);
	/* Without one, only a local socket's flows: not what the node
	 * forwards or encapsulates. */
	if (!skb->sk)
		return TC_ACT_OK;
	return track_flow(skb, p, POLICY_DIR_INGRESS, IFSTATE_NO_POLICY);
}

/* judge_other: a packet of a protocol the datapath neither balances nor
 * tracks (GRE, ESP, ...). Entering the node toward a service network it is
 * dropped (portless_to_service_net). A workload's policy judges it packet by
 * packet at the workload's hooks, so isolation holds for every protocol (a
 * rule with ports never matches it: ports are TCP's, UDP's and SCTP's);
 * elsewhere it passes. */
static __always_inline int judge_other(struct __sk_buff *skb, const struct packet *p, enum hook hook)
{
	if (hook == HOOK_FROM_WL || hook == HOOK_FROM_HOST) {
		int verdict = portless_to_service_net(p->daddr);
		if (verdict != TC_ACT_OK)
			return verdict;
	}
	if (hook == HOOK_FROM_WL)
		return judge_stateless(skb, p, POLICY_DIR_EGRESS);
	if (hook == HOOK_TO_WL)
		return judge_stateless(skb, p, POLICY_DIR_INGRESS);
	return TC_ACT_OK;
}

/* moved_flow: a TCP segment from outside, not a SYN, of a flow this node
 * does not know. With DSR for TCP, a segment to an external frontend is a
 * connection that an upstream router moved here (an ECMP rehash, a node
 * drained) or whose entries expired: it is balanced as a new flow. The
 * backend sees the client's own address, so with Maglev (the same pick on
 * every node) the connection goes on where it was; when its backend is gone,
 * the one picked answers with a RST, which reaches the client from the
 * frontend: never silence. Without DSR the backend would see another source
 * and the segment passes to the node's stack, as before. */
__subprog int moved_flow(struct __sk_buff *skb, struct packet *p)
{
	struct config *cfg = config_get();

	if (!cfg || !(cfg->flags & CFG_DSR_TCP))
		return TC_ACT_OK;
	struct fe_value *fe = fe_lookup(p->daddr, p->dport, p->proto);
	if (!fe || !(fe->flags & FE_EXTERNAL))
		return TC_ACT_OK;
	return new_flow(skb, p, HOOK_FROM_HOST, fe);
}

/* l2_len: ETH_HLEN, or 0 on an L3 device (parse.h). */
static __always_inline int pipeline(struct __sk_buff *skb, enum hook hook, const __u32 l2_len)
{
	struct packet p;

	switch (parse_packet(skb, &p, l2_len)) {
	case PARSE_NOT_IPV4:
		/* IPv6 has a pipeline of its own (datapath6.h), in a frame of
		 * its own. A packet from outside may carry a DSR header first
		 * (dsr6.h). */
		if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
			if (hook == HOOK_FROM_HOST) {
				int verdict = dsr6_pull_first(skb, l2_len);
				if (verdict)
					return verdict;
			}
			return pipeline6(skb, hook, l2_len);
		}
		return TC_ACT_OK;
	case PARSE_MALFORMED:
		return drop(CNT_DROP_MALFORMED);
	}
	if (!has_ports(p.proto)) {
		if (p.fragment) {
			count(CNT_PASS_FRAGMENT);
			return TC_ACT_OK;
		}
		if (p.proto == IPPROTO_ICMP)
			return handle_icmp(skb, &p, hook);
		return judge_other(skb, &p, hook);
	}
	/* A packet from outside with IP options may carry a DSR option
	 * (dsr.h): this node is then the backend's, and tracks the flow. */
	if (hook == HOOK_FROM_HOST && p.l4_off - p.l3_off != sizeof(struct iphdr)) {
		int verdict = dsr_pull4(skb, &p);
		if (verdict)
			return verdict;
	}
	if (p.fragment) {
		if (!p.l4_absent)
			frag_learn(&p);
		else if (frag_ports(&p))
			return unknown_fragment(&p);
		else
			count(CNT_FRAGMENT_TRANSLATED);
	}

	/* Each packet is translated once on a node: where it enters (from a
	 * workload or from outside), or, for what the node itself sends or
	 * receives on an interface Sluice does not manage, where it leaves. */
	if ((hook == HOOK_TO_WL || hook == HOOK_TO_HOST) && entered_managed(skb))
		return handled_upstream(skb, &p, hook);

	struct ct_key key;
	ct_key_of(&p, &key);
	struct ct_value *v = bpf_map_lookup_elem(&sl_ct_v2, &key);
	if (!v && ct_from_previous(&key))
		v = bpf_map_lookup_elem(&sl_ct_v2, &key);
	/* Only a SYN, or a datagram of an untranslated flow, may start a new
	 * flow over an entry: other packets skip the call. */
	if (v && v->type == CT_FORWARD &&
	    ((p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN || (!v->svc_id && p.proto != IPPROTO_TCP)) &&
	    superseded(&p, v))
		v = NULL;
	if (v) {
		/* A packet that may close a service flow: its end's event. */
		if ((p.tcp_flags & (TCP_FLAG_FIN | TCP_FLAG_RST)) && v->svc_id &&
		    !(v->tcp_seen & (TCP_FLAG_FIN | TCP_FLAG_RST)) && ev_flow_events())
			ev_flow_end4(skb, &p, hook, v);
		ct_touch(v, &p);
		/* Each packet is counted once, at the hook that translates it. */
		if (v->svc_id)
			svcstats_count(v->svc_id, &p, v->type == CT_REVERSE, 0);
		/* Each datagram of a UDP flow sent by DSR carries the option: any
		 * of them may be the first the backend's node sees. */
		if (hook == HOOK_FROM_HOST && (v->flags & (CT_DSR | CT_BACKEND_LOCAL)) == CT_DSR &&
		    p.proto == IPPROTO_UDP && v->type == CT_FORWARD && !p.l4_absent) {
			int room = dsr_push4(skb, &p, v->nat_addr);
			if (room > 0)
				return dsr_too_big(skb, &p, room);
		}
		/* A packet entering whose verdict is known
		 * (passes_translated) leaves its translation's store to
		 * sl_write_span (rewrite.h), unless it entered from outside
		 * and was SNATed: it may leave with the node's address as
		 * source, to be routed by the FIB (below). */
		if (passes_translated(hook, v->type, v->flags, v->pol_egress, v->tcp_seen) &&
		    !(hook == HOOK_FROM_HOST && l2_len == ETH_HLEN &&
		      (v->flags & (CT_FROM_HOST | CT_SNAT)) == (CT_FROM_HOST | CT_SNAT))) {
			int err = ct_apply(skb, &p, v, 1);
			if (err == SPAN_DEFERRED)
				return WRITE_SPAN;
			if (err)
				return drop(CNT_DROP_MALFORMED);
			return hook == HOOK_FROM_WL ? ROUTED_BY_STACK : TC_ACT_OK;
		}
		if (ct_apply_framed(skb, &p, v))
			return drop(CNT_DROP_MALFORMED);
		if (hook == HOOK_FROM_WL && (v->flags & CT_HAIRPIN))
			return hairpin_verdict(skb, v->type == CT_FORWARD ? enforce(skb, &p, v, POLICY_DIR_EGRESS) : TC_ACT_OK);
		/* Leaving a workload with the node's address as source (a
		 * NodePort reply from a local backend, a flow SNATed to the
		 * node): routed here, as the stack would drop it. */
		if (hook == HOOK_FROM_WL && (v->flags & CT_NODE_SOURCE) && is_host_ip(p.saddr))
			return fib_verdict(skb, v->type == CT_FORWARD ? enforce(skb, &p, v, POLICY_DIR_EGRESS) : TC_ACT_OK);
		/* A direct reply, now from the frontend (dsr.h): the node's stack
		 * would take another node's address on a pod's interface for a
		 * spoof. */
		if (hook == HOOK_FROM_WL && (v->flags & CT_DSR) && v->type == CT_REVERSE)
			return FORWARD_BY_FIB;
		if (hook == HOOK_FROM_WL)
			return deliver_flow(skb, v->type == CT_FORWARD ? enforce(skb, &p, v, POLICY_DIR_EGRESS) : TC_ACT_OK,
					    &v->tcp_seen, 0);
		if (v->type == CT_FORWARD && hook == HOOK_TO_WL)
			return enforce(skb, &p, v, POLICY_DIR_INGRESS);
		/* A flow that entered from outside carries its host endpoint's
		 * verdict, judged on its first packet (ALLOWED when none judged
		 * it); the node's own flows are judged as they leave. */
		if (v->type == CT_FORWARD && hook == HOOK_FROM_HOST && v->pol_egress != POL_ALLOWED)
			return drop(CNT_DROP_POLICY);
		/* External traffic SNATed to the node, and the replies of a
		 * NodePort flow to a remote backend (always SNATed), leave with
		 * the node's address as source (new_flow). A flow adopted from
		 * netfilter (conntrack.Adopt) may have been SNATed to another
		 * address of the node (MASQUERADE picks the outgoing
		 * interface's): any source other than the client's is one. */
		if (hook == HOOK_FROM_HOST && l2_len == ETH_HLEN &&
		    (v->flags & (CT_FROM_HOST | CT_SNAT)) == (CT_FROM_HOST | CT_SNAT) &&
		    (is_host_ip(p.saddr) || (v->type == CT_FORWARD && v->snat_addr != key.saddr)))
			return FORWARD_BY_FIB;
		if (v->type == CT_FORWARD && hook == HOOK_TO_HOST && !skb->ingress_ifindex)
			return enforce(skb, &p, v, POLICY_DIR_INGRESS);
		return TC_ACT_OK; /* a reply, or a hook without policy */
	}

	if (p.l4_absent)
		return untracked_fragment(skb, &p, hook);
	if (hook == HOOK_TO_HOST)
		return host_new_flow_out(skb, &p);
	if (hook == HOOK_TO_WL)
		return to_workload_new(skb, &p);
	/* Only a connection's first segment is balanced: a segment of a flow
	 * conntrack does not know would reach a backend that never saw its SYN.
	 * A workload's egress policy still judges it, packet by packet. With
	 * DSR, a connection to an external frontend that an upstream router
	 * moved here is the exception (moved_flow). */
	if (p.proto == IPPROTO_TCP && (p.tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) != TCP_FLAG_SYN) {
		if (hook == HOOK_FROM_HOST)
			return moved_flow(skb, &p);
		return hook == HOOK_FROM_WL ? stack_routed(judge_stateless(skb, &p, POLICY_DIR_EGRESS)) : TC_ACT_OK;
	}
	/* While a takeover adopts netfilter's flows, a datagram no entry knows
	 * may be one of them: it goes to netfilter, on the backend it has. */
	if (p.proto == IPPROTO_UDP && adopting())
		return hook == HOOK_FROM_WL ? stack_routed(judge_stateless(skb, &p, POLICY_DIR_EGRESS)) : TC_ACT_OK;
	struct fe_value *fe = fe_lookup(p.daddr, p.dport, p.proto);
	if (fe)
		return new_flow(skb, &p, hook, fe);
	/* A service address that serves nothing here refuses the flow, as
	 * kube-proxy nftables' cluster-ips-check does (svcnet.h). */
	switch (svcnet_kind4(p.daddr)) {
	case SVCNET_CLUSTER_IP:
		return reject(skb, &p, CNT_REJECT_UNDEFINED_PORT);
	case SVCNET_RANGE:
		return drop(CNT_DROP_UNALLOCATED_SERVICE_IP);
	default:
		break;
	}
	/* Traffic from a workload waits for its egress policy; traffic from
	 * outside to the node itself, for its host endpoint's ingress policy. */
	return track_flow(skb, &p, POLICY_DIR_EGRESS,
			  hook == HOOK_FROM_WL ? policy_slot(skb, POLICY_DIR_EGRESS) : host_ingress_slot(skb, &p, is_host_ip(p.daddr)));
}

