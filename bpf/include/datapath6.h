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
 * never FORWARD_BY_FIB (IPv6 drops no packet for a local source address).
 *
 * Its parts live beside it, each the twin of an IPv4 header: reject6.h (RST,
 * port unreachable, echo replies), icmp_error6.h (errors about NATed flows),
 * policy6.h (the policy hand-off and verdict records), events6.h (flow
 * events). */
#pragma once

#include "common.h"
#include "config.h"
#include "conntrack6.h"
#include "counters.h"
#include "csum.h"
#include "dsr6.h"
#include "events.h"
#include "events6.h"
#include "hook.h"
#include "icmp_error6.h"
#include "ifstate.h"
#include "ipv6.h"
#include "policy.h"
#include "policy6.h"
#include "reject.h"
#include "reject6.h"
#include "rewrite6.h"
#include "service6.h"
#include "svcstats.h"

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

/* portless_to_service_net6: portless_to_service_net (datapath.h). */
static __always_inline int portless_to_service_net6(const __u8 *daddr)
{
	if (svcnet_kind6(daddr) != SVCNET_NONE)
		return drop(CNT_DROP_UNALLOCATED_SERVICE_IP);
	return TC_ACT_OK;
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
		if (hook != HOOK_FROM_WL && hook != HOOK_FROM_HOST)
			return TC_ACT_OK;
		if (!is_service_ip6(p6->daddr))
			return portless_to_service_net6(p6->daddr);
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
	if (skb->sk && svcnet_kind6(p6->daddr) == SVCNET_RANGE)
		return drop(CNT_DROP_UNALLOCATED_SERVICE_IP);
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
	if (!has_ports(p->proto)) {
		if (p->fragment) {
			count(CNT_PASS_FRAGMENT);
			return TC_ACT_OK;
		}
		if (p->proto == IPPROTO_ICMPV6)
			return handle_icmp6(skb, &p6, hook);
		/* judge_other (datapath.h): isolation holds for every protocol. */
		if (hook == HOOK_FROM_WL || hook == HOOK_FROM_HOST) {
			int verdict = portless_to_service_net6(p6.daddr);
			if (verdict != TC_ACT_OK)
				return verdict;
		}
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
	if (!v && ct6_from_previous(&key))
		v = bpf_map_lookup_elem(&sl_ct6_v1, &key);
	if (v && v->type == CT_FORWARD &&
	    ((p->tcp_flags & (TCP_FLAG_SYN | TCP_FLAG_ACK)) == TCP_FLAG_SYN || (!v->svc_id && p->proto != IPPROTO_TCP)) &&
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
		/* An unserved service address (svcnet.h, pipeline). */
		if (!fe) {
			enum svcnet_kind kind = svcnet_kind6(p6.daddr);
			if (kind == SVCNET_CLUSTER_IP)
				return reject6(skb, &p6, CNT_REJECT_UNDEFINED_PORT);
			if (kind == SVCNET_RANGE)
				return drop(CNT_DROP_UNALLOCATED_SERVICE_IP);
		}
		if (!fe)
			return track_flow6(skb, &p6, &key, POLICY_DIR_EGRESS,
					   hook == HOOK_FROM_WL ? policy_slot(skb, POLICY_DIR_EGRESS)
								: host_ingress_slot(skb, p, is_host_ip6(p6.daddr)));
	}
	int verdict = new_flow6(skb, &p6, hook, fe, &key);
	if (verdict != TC_ACT_SHOT && verdict != NEW_FLOW_REJECT && ev_flow_events())
		ev_flow_start6(skb->ifindex, &key, hook);
	if (verdict & NEW_FLOW_DSR) {
		verdict &= ~NEW_FLOW_DSR;
		if (dsr6_push(skb, &p6, &key))
			return drop(CNT_DROP_DSR_FAILED);
	}
	return verdict == NEW_FLOW_REJECT ? reject6(skb, &p6, CNT_REJECT_NO_ENDPOINTS) : verdict;
}
