/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Socket-level load balancing for host processes (cgroup v2 hooks): connect()
 * and sendmsg() to a service are rewritten to a backend before the socket
 * sends anything, using the same frontend, backend and affinity maps and the
 * same policies as the TC path; getpeername() and recvmsg() give the service's
 * address back.
 *
 * The reverse translation lives in sl_sock_v1, keyed by the socket's cookie and
 * the backend, so it cannot be confused between sockets, nor between two
 * services one socket talks to.
 *
 * A connected UDP socket stays pinned to the backend its connect() chose. When
 * that backend leaves its service, sl_sock_egress fails the socket's next send
 * (EPERM) and forgets its translation: the client's reconnect (or a new socket)
 * is balanced again to a live backend. TCP is never cut (graceful termination).
 *
 * cgroup programs return 1 to let the call (or the packet) go on and 0 to fail
 * it; bpf_set_retval picks the errno the caller sees instead of EPERM. */
#pragma once

#include "common.h"
#include "config.h"
#include "consts.h"
#include "counters.h"
#include "service.h"
#include "service6.h"
#include "svcnet.h"

#define AF_INET		2
#define ECONNREFUSED	111
#define EHOSTUNREACH	113

struct sock_key {
	__u64 cookie;		/* host order: bpf_get_socket_cookie() */
	__be32 backend_addr;	/* network order */
	__be16 backend_port;	/* network order */
	__u16 pad;		/* 0 */
};
ASSERT_SIZE(struct sock_key, 16);

struct sock_value {
	__u64 ts;		/* host order: sl_now() of the last connect/send */
	__be32 frontend_addr;	/* network order: the service address to give back */
	__be16 frontend_port;	/* network order */
	__u16 pad;		/* 0 */
	__u32 svc_id;		/* host order: where the backend was chosen */
	__u32 ordinal;		/* host order: the backend's ordinal then */
};
ASSERT_SIZE(struct sock_value, 24);

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_SOCK_MAX);
	__type(key, struct sock_key);
	__type(value, struct sock_value);
} sl_sock_v1 SEC(".maps");

static __always_inline int socklb_applies(void *ctx, const struct config *cfg)
{
	if (cfg && (cfg->flags & CFG_SOCKLB_HOST_ONLY))
		return bpf_get_netns_cookie(ctx) == cfg->host_netns_cookie;
	return 1;
}

/* socklb_fail fails the call with the errno of a pick that found no backend. */
static __always_inline int socklb_fail(int picked)
{
	switch (picked) {
	case PICK_NO_ENDPOINTS:
		count(CNT_SOCK_REJECT_NO_ENDPOINTS);
		bpf_set_retval(-ECONNREFUSED);
		return 0;
	case PICK_NO_LOCAL:
		count(CNT_SOCK_NO_LOCAL_BACKEND);
		bpf_set_retval(-EHOSTUNREACH);
		return 0;
	}
	count(CNT_DROP_BACKEND_MISSING);
	bpf_set_retval(-EHOSTUNREACH);
	return 0;
}

/* socklb_unserved: a connect() or sendmsg() to an address no frontend
 * matched. A port of an allocated ClusterIP that no Service defines is
 * refused (ECONNREFUSED, as kube-proxy's reject gives it); anything else goes
 * on (an unallocated address of a ServiceCIDR is dropped at the egress hook,
 * host_new_flow_out, as kube-proxy drops it). */
static __always_inline int socklb_unserved(enum svcnet_kind kind)
{
	if (kind != SVCNET_CLUSTER_IP)
		return 1;
	count(CNT_SOCK_REJECT_UNDEFINED_PORT);
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

/* SOCKLB_PASS: socklb_balance found no frontend for the destination, or
 * may not balance it: the call goes on untranslated. */
#define SOCKLB_PASS 2

/* socklb_balance picks the backend for an IPv4 destination addr:port of a
 * connect() or sendmsg() and records the reverse translation; it returns 1
 * with *be set, SOCKLB_PASS, or 0 (the call fails, the retval set). */
static __always_inline int socklb_balance(struct bpf_sock_addr *ctx, const struct config *cfg,
					  __be32 addr, __be16 port, struct be_value *be)
{
	__u32 ordinal;
	struct fe_value *fe = fe_lookup(addr, port, ctx->protocol);

	if (!fe)
		return socklb_unserved(svcnet_kind4(addr)) ? SOCKLB_PASS : 0;
	/* Host sockets share the node's address as their client identity, as
	 * their packets would with kube-proxy; external policy Local does not
	 * apply to host traffic (it goes to every endpoint). */
	__be32 client = cfg ? cfg->node_ip : 0;
	/* loadBalancerSourceRanges hold on this path too: a socket is balanced
	 * here only if the node's address may use the frontend; otherwise its
	 * packets leave as they are, and the TC path judges their real source. */
	if (!src_allowed(fe, client))
		return SOCKLB_PASS;
	int picked = pick_backend(fe, client, 0, 0, fe->flags & FE_INT_LOCAL, be, &ordinal);
	if (picked != PICK_OK)
		return socklb_fail(picked);

	struct sock_key key = { .cookie = bpf_get_socket_cookie(ctx), .backend_addr = be->addr, .backend_port = be->port };
	struct sock_value val = {
		.ts = sl_now(), .frontend_addr = addr, .frontend_port = port,
		.svc_id = fe->svc_id, .ordinal = ordinal,
	};
	bpf_map_update_elem(&sl_sock_v1, &key, &val, BPF_ANY);
	return 1;
}

/* socklb_translate rewrites the destination of a connect() or sendmsg(); it
 * returns the hook's verdict (1 proceed, 0 fail with the retval set). */
static __always_inline int socklb_translate(struct bpf_sock_addr *ctx)
{
	struct config *cfg = config_get();
	struct be_value be;

	if (ctx->user_family != AF_INET || !socklb_applies(ctx, cfg))
		return 1;
	int r = socklb_balance(ctx, cfg, ctx->user_ip4, (__be16)ctx->user_port, &be);
	if (r != 1)
		return r == SOCKLB_PASS;
	ctx->user_ip4 = be.addr;
	ctx->user_port = (__u32)be.port;
	return 1;
}

/* socklb_reverse gives the service address back for a peer that is a backend
 * this socket was balanced to. max_age 0: no age limit. */
static __always_inline int socklb_reverse(struct bpf_sock_addr *ctx, __u64 max_age)
{
	struct sock_key key = {
		.cookie = bpf_get_socket_cookie(ctx),
		.backend_addr = ctx->user_ip4, .backend_port = (__be16)ctx->user_port,
	};

	if (ctx->user_family != AF_INET)
		return 1;
	struct sock_value *v = bpf_map_lookup_elem(&sl_sock_v1, &key);
	if (!v || (max_age && sl_now() - v->ts > max_age))
		return 1;
	ctx->user_ip4 = v->frontend_addr;
	ctx->user_port = (__u32)v->frontend_port;
	return 1;
}

__subprog int socklb_check_egress6(struct __sk_buff *skb);

/* socklb_check_egress fails a UDP send whose socket was balanced to a backend
 * that is no longer at its place in the service. */
static __always_inline int socklb_check_egress(struct __sk_buff *skb)
{
	/* cgroup_skb verdicts: 1 lets the packet go, 0 fails the send (EPERM).
	 * The packet starts at the IP header here. */
	struct iphdr ip;
	__be16 ports[2];

	if (skb->protocol == bpf_htons(ETH_P_IPV6))
		return socklb_check_egress6(skb);
	if (skb->protocol != bpf_htons(ETH_P_IP) || bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) ||
	    ip.protocol != IPPROTO_UDP || ip.ihl < 5 ||
	    bpf_skb_load_bytes(skb, ip.ihl * 4, ports, sizeof(ports)))
		return 1;
	struct sock_key key = { .cookie = bpf_get_socket_cookie(skb), .backend_addr = ip.daddr, .backend_port = ports[1] };
	struct sock_value *v = bpf_map_lookup_elem(&sl_sock_v1, &key);
	if (!v)
		return 1;
	struct be_key bkey = { .svc_id = v->svc_id, .ordinal = v->ordinal };
	struct be_value *be = bpf_map_lookup_elem(&sl_be_v1, &bkey);
	if (be && be->addr == ip.daddr && be->port == ports[1])
		return 1;
	bpf_map_delete_elem(&sl_sock_v1, &key);
	count(CNT_SOCK_STALE_BACKEND);
	return 0;
}

/* ---- IPv6 sockets: connect6, sendmsg6, recvmsg6, getpeername6 ----
 *
 * An IPv6 socket's destination is balanced on the IPv6 maps. A dual-stack
 * socket's IPv4-mapped destination (::ffff:a.b.c.d) is an IPv4 one: it is
 * balanced on the IPv4 maps, its reverse translation kept in sl_sock_v1, and
 * the backend written back IPv4-mapped. */

#define AF_INET6	10

struct sock6_key {
	__u64 cookie;		/* host order: bpf_get_socket_cookie() */
	__u8 backend_addr[16];	/* network order */
	__be16 backend_port;	/* network order */
	__u16 pad[3];		/* 0 */
};
ASSERT_SIZE(struct sock6_key, 32);

struct sock6_value {
	__u64 ts;		/* host order, as sock_value's */
	__u8 frontend_addr[16];	/* network order: the service address to give back */
	__be16 frontend_port;	/* network order */
	__u16 pad;		/* 0 */
	__u32 svc_id;		/* host order */
	__u32 ordinal;		/* host order */
	__u32 pad2;		/* 0 */
};
ASSERT_SIZE(struct sock6_value, 40);

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, SL_SOCK_MAX);
	__type(key, struct sock6_key);
	__type(value, struct sock6_value);
} sl_sock6_v1 SEC(".maps");

static __always_inline void user_ip6_get(const struct bpf_sock_addr *ctx, __u8 *addr)
{
	__u32 w[4] = { ctx->user_ip6[0], ctx->user_ip6[1], ctx->user_ip6[2], ctx->user_ip6[3] };

	__builtin_memcpy(addr, w, 16);
}

static __always_inline void user_ip6_set(struct bpf_sock_addr *ctx, const __u8 *addr)
{
	__u32 w[4];

	__builtin_memcpy(w, addr, 16);
	ctx->user_ip6[0] = w[0];
	ctx->user_ip6[1] = w[1];
	ctx->user_ip6[2] = w[2];
	ctx->user_ip6[3] = w[3];
}

/* v4_mapped: the IPv4 address of ::ffff:a.b.c.d, or 0 for any other address. */
static __always_inline __be32 v4_mapped(const struct bpf_sock_addr *ctx)
{
	if (ctx->user_ip6[0] || ctx->user_ip6[1] || ctx->user_ip6[2] != bpf_htonl(0xffff))
		return 0;
	return ctx->user_ip6[3];
}

/* socklb_translate_mapped: socklb_translate for a dual-stack socket's
 * IPv4-mapped destination; the backend is written back mapped. */
static __always_inline int socklb_translate_mapped(struct bpf_sock_addr *ctx, const struct config *cfg, __be32 addr)
{
	struct be_value be;
	int r = socklb_balance(ctx, cfg, addr, (__be16)ctx->user_port, &be);

	if (r != 1)
		return r == SOCKLB_PASS;
	ctx->user_ip6[3] = be.addr;
	ctx->user_port = (__u32)be.port;
	return 1;
}

/* socklb_translate6: socklb_translate for an IPv6 socket. */
static __always_inline int socklb_translate6(struct bpf_sock_addr *ctx)
{
	struct config *cfg = config_get();
	struct config6 *cfg6 = config6_get();
	struct be6_value be;
	__u8 addr[16];

	if (ctx->user_family != AF_INET6 || !socklb_applies(ctx, cfg))
		return 1;
	__be32 mapped = v4_mapped(ctx);
	if (mapped)
		return socklb_translate_mapped(ctx, cfg, mapped);
	user_ip6_get(ctx, addr);
	__be16 port = (__be16)ctx->user_port;
	struct fe_value *fe = fe6_lookup(addr, port, ctx->protocol);
	if (!fe)
		return socklb_unserved(svcnet_kind6(addr));
	/* Host sockets are the node's IPv6 address to affinity and source
	 * ranges, as in socklb_translate. */
	__u8 client[16] = {};
	if (cfg6)
		addr6_copy(client, cfg6->node_ip);
	if (!src_allowed6(fe, client))
		return 1;
	__u32 ordinal;
	int picked = pick_backend6(fe, client, 0, 0, fe->flags & FE_INT_LOCAL, &be, &ordinal);
	if (picked != PICK_OK)
		return socklb_fail(picked);

	struct sock6_key key = { .cookie = bpf_get_socket_cookie(ctx), .backend_port = be.port };
	struct sock6_value val = { .ts = sl_now(), .frontend_port = port, .svc_id = fe->svc_id, .ordinal = ordinal };
	addr6_copy(key.backend_addr, be.addr);
	addr6_copy(val.frontend_addr, addr);
	bpf_map_update_elem(&sl_sock6_v1, &key, &val, BPF_ANY);
	user_ip6_set(ctx, be.addr);
	ctx->user_port = (__u32)be.port;
	return 1;
}

/* socklb_reverse6: socklb_reverse for an IPv6 socket (an IPv4-mapped peer
 * is looked up in sl_sock_v1). */
static __always_inline int socklb_reverse6(struct bpf_sock_addr *ctx, __u64 max_age)
{
	if (ctx->user_family != AF_INET6)
		return 1;
	__be32 mapped = v4_mapped(ctx);
	if (mapped) {
		struct sock_key key = {
			.cookie = bpf_get_socket_cookie(ctx), .backend_addr = mapped, .backend_port = (__be16)ctx->user_port,
		};
		struct sock_value *v = bpf_map_lookup_elem(&sl_sock_v1, &key);
		if (!v || (max_age && sl_now() - v->ts > max_age))
			return 1;
		ctx->user_ip6[3] = v->frontend_addr;
		ctx->user_port = (__u32)v->frontend_port;
		return 1;
	}
	struct sock6_key key = { .cookie = bpf_get_socket_cookie(ctx), .backend_port = (__be16)ctx->user_port };
	user_ip6_get(ctx, key.backend_addr);
	struct sock6_value *v = bpf_map_lookup_elem(&sl_sock6_v1, &key);
	if (!v || (max_age && sl_now() - v->ts > max_age))
		return 1;
	user_ip6_set(ctx, v->frontend_addr);
	ctx->user_port = (__u32)v->frontend_port;
	return 1;
}

/* socklb_check_egress6: socklb_check_egress for an IPv6 datagram (without
 * extension headers: a socket's own UDP carries none). */
__subprog int socklb_check_egress6(struct __sk_buff *skb)
{
	struct ip6_raw ip;
	__be16 ports[2];

	if (bpf_skb_load_bytes(skb, 0, &ip, sizeof(ip)) || ip.nexthdr != IPPROTO_UDP ||
	    bpf_skb_load_bytes(skb, IPV6_HLEN, ports, sizeof(ports)))
		return 1;
	struct sock6_key key = { .cookie = bpf_get_socket_cookie(skb), .backend_port = ports[1] };
	addr6_copy(key.backend_addr, ip.daddr);
	struct sock6_value *v = bpf_map_lookup_elem(&sl_sock6_v1, &key);
	if (!v)
		return 1;
	struct be_key bkey = { .svc_id = v->svc_id, .ordinal = v->ordinal };
	struct be6_value *be = bpf_map_lookup_elem(&sl_be6_v1, &bkey);
	if (be && addr6_eq(be->addr, ip.daddr) && be->port == ports[1])
		return 1;
	bpf_map_delete_elem(&sl_sock6_v1, &key);
	count(CNT_SOCK_STALE_BACKEND);
	return 0;
}
