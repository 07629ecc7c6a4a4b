/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Node-wide settings (sl_config_v1, a one-entry array) and this node's addresses
 * (sl_hostip_v1). Both are written by userspace at run time, so no program is
 * reloaded when a node IP changes. */
#pragma once

#include "common.h"
#include "consts.h"

enum config_flags : __u32 {
	/* Socket-level load balancing applies only to sockets of the network
	 * namespace host_netns_cookie names; pods then use the TC path. */
	CFG_SOCKLB_HOST_ONLY = 1 << 0,
	/* --masquerade-all: every balanced flow leaves with the node IP. */
	CFG_MASQUERADE_ALL = 1 << 1,
	/* --detect-local-mode=InterfaceNamePrefix: traffic is the cluster's own
	 * when it entered an interface marked IFS_LOCAL_TRAFFIC, rather than
	 * when its source is inside cluster_net/cluster_mask. */
	CFG_LOCAL_BY_IFACE = 1 << 2,
	/* --external-service-mode=dsr|hybrid: external TCP traffic to a
	 * backend on another node keeps the client's address and the backend's
	 * node answers the client directly (dsr.h). */
	CFG_DSR_TCP = 1 << 3,
	/* --external-service-mode=dsr: the same for UDP. */
	CFG_DSR_UDP = 1 << 4,
	/* --flow-events: service flows' starts and ends are written to the
	 * event ring buffer, besides drops (events.h). */
	CFG_FLOW_EVENTS = 1 << 5,
	/* --stack-routing: a workload's packets to another workload on this
	 * node pass through the node's IP stack (and its netfilter), rather
	 * than being handed over by the datapath (deliver.h). */
	CFG_STACK_ROUTING = 1 << 6,
	/* The agent is taking the node over from another proxy (kube-proxy):
	 * netfilter may hold UDP flows it translated that Sluice has not
	 * adopted yet (conntrack.Adopt). Until the agent clears it, a datagram
	 * no entry knows passes untouched to the node's stack, whose
	 * netfilter keeps it on its backend, rather than being balanced
	 * afresh. */
	CFG_ADOPTING = 1 << 7,
};

struct config {
	__be32 node_ip;		/* network order: source of SNATed flows (NodePort to a
				 * remote backend, hairpin); 0 disables SNAT: such flows
				 * are then forwarded with the client's address. Also the
				 * session-affinity identity of host sockets. */
	__u16 snat_port_min;	/* host order: 0 means SNAT_PORT_MIN_DEFAULT */
	__u16 snat_port_max;	/* host order: 0 means SNAT_PORT_MAX_DEFAULT */
	__u64 host_netns_cookie; /* host order: the host network namespace's cookie */
	enum config_flags flags; /* host order */
	__u32 events_per_sec;	/* host order: the flow events each CPU may write a
				 * second; 0: none (events.h) */
	__be32 cluster_net;	/* network order: the cluster's (or with
				 * --detect-local-mode=NodeCIDR, this node's) pod
				 * CIDR; with cluster_mask 0 it is unset */
	__be32 cluster_mask;	/* network order: its mask. ClusterIP traffic from
				 * outside it is SNATed (kube-proxy) */
};
ASSERT_SIZE(struct config, 32);

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct config);
} sl_config_v1 SEC(".maps");

struct hostip_key {
	__be32 addr;		/* network order: an IPv4 address of this node */
};
ASSERT_SIZE(struct hostip_key, 4);

struct hostip_value {
	__u32 flags;		/* host order: reserved, 0 */
};
ASSERT_SIZE(struct hostip_value, 4);

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, SL_HOSTIP_MAX);
	__type(key, struct hostip_key);
	__type(value, struct hostip_value);
} sl_hostip_v1 SEC(".maps");

static __always_inline struct config *config_get(void)
{
	__u32 zero = 0;
	return bpf_map_lookup_elem(&sl_config_v1, &zero);
}

/* adopting: the agent has not yet adopted every flow netfilter translated
 * (CFG_ADOPTING). */
static __always_inline int adopting(void)
{
	struct config *cfg = config_get();

	return cfg && (cfg->flags & CFG_ADOPTING);
}

static __always_inline int is_host_ip(__be32 addr)
{
	struct hostip_key key = { .addr = addr };
	return bpf_map_lookup_elem(&sl_hostip_v1, &key) != NULL;
}
