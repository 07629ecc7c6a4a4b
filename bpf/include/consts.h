/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Default map capacities and datapath constants. Userspace may override the
 * capacities when it creates the maps (maps.OpenOptions); the programs never
 * depend on the exact number. */
#pragma once

#define SL_FE_MAX		262144		/* frontends: service IP:port:proto entries */
#define SL_BE_MAX		1048576		/* backends: (service, ordinal) entries */
#define SL_SRCRANGE_MAX		16384		/* loadBalancerSourceRanges CIDRs */
#define SL_SVCNET_MAX		262144		/* ServiceCIDRs and allocated ClusterIPs */
#define SL_AFF_MAX		65536		/* session affinity entries (LRU) */
#define SL_CT_MAX		524288		/* conntrack entries, two per flow */
#define SL_HOSTIP_MAX		256		/* this node's addresses */
#define SL_SOCK_MAX		65536		/* socket-LB reverse translations (LRU) */
#define SL_PREFILTER_MAX	65536		/* XDP deny-list CIDRs */
#define SL_FAILSAFE_MAX		64		/* XDP failsafe inbound ports */
#define SL_IFSTATE_MAX		16384		/* managed interfaces */
#define SL_POLPROG_MAX		16384		/* policy program slots (0: the verdict program) */
#define SL_RULECTR_MAX		65536		/* per-rule counters */
#define SL_IPSET_MAX		262144		/* IP set members */
#define SL_FRAG_MAX		16384		/* datagrams in flight as fragments (LRU) */
#define SL_SVCSTATS_MAX		65536		/* per-service counters, by service id */
#define SL_MAGLEV_MAX		65536		/* Maglev tables, one per service id */
#define SL_ROUTE_MAX		16384		/* local delivery's FIB answers, per
						 * {destination, ingress interface} (LRU) */

/* An unconnected UDP socket's translation is used for replies (recvmsg) up to
 * this long after its last send; later "replies" keep the backend's address. */
#define SOCK_REVNAT_TIMEOUT_NS	(600 * NS_PER_SEC)

#define NS_PER_SEC		1000000000ULL
/* A first fragment's ports serve the rest of its datagram this long (Linux's
 * net.ipv4.ipfrag_time default). */
#define FRAG_TIMEOUT_NS		(30 * NS_PER_SEC)
/* A TCP flow whose server closed first: the server holds the tuple in
 * TIME_WAIT, and a new flow on it would meet PAWS, for this long after the
 * flow's last packet (2 MSL, as netfilter's TIME_WAIT timeout). The conntrack
 * scanner keeps such flows at least this long (conntrack.Timeouts). */
#define TCP_TIME_WAIT_NS	(120 * NS_PER_SEC)
/* A conntrack entry's last_seen is refreshed at most this often, so an
 * established flow does not write the shared cache line on every packet. The
 * scanner's timeouts are seconds to hours, far coarser. */
#define CT_REFRESH_NS		(NS_PER_SEC / 4)

/* When a SNATed flow cannot keep the client's port, another is drawn at
 * random in this range: netfilter's MASQUERADE's, every unprivileged port. A
 * node's own connections never share a tuple with a SNATed flow: the node's
 * flows leaving a data interface or entering a workload are tracked
 * (host_new_flow_out, to_workload_new; datapath.h), so a draw never takes
 * their tuple, and one that starts on a tuple a SNATed flow holds is
 * remapped as it leaves, as netfilter remaps a local connection. The
 * agent's --snat-port-range narrows it (sl_config_v1's snat_port_min/max). */
#define SNAT_PORT_MIN_DEFAULT	1024
#define SNAT_PORT_MAX_DEFAULT	65535
/* How many random ports a flow whose reverse tuple is taken tries before it
 * is refused (CNT_DROP_SNAT_PORTS), as netfilter's NAT tries up to 128 and
 * then fewer. Each try is one hash probe; ports are drawn at random, so the
 * expected number of tries is 1/(1 - the share of the range taken): a
 * refusal needs nearly all of it taken (at 90%, 1 in 700,000). Eight tries
 * refused a flow in 300 when a client's closed flows held half of the range
 * (bench: BenchmarkBaselines), and the client's SYN then waited a second. */
#define PORT_TRIES		128
/* After a search on a CPU found no free port, that CPU's searches try only
 * PORT_TRIES_CROWDED ports until one succeeds or PORT_CROWDED_NS pass (ct_new.h,
 * port_tries): each try is a cache miss, and a flood of clashing SYNs into a
 * range already full would cost 128 of them a packet (38 µs here,
 * bench: BenchmarkRemapSearch) where 8 cost 5 µs. */
#define PORT_TRIES_CROWDED	8
#define PORT_CROWDED_NS		NS_PER_SEC
/* A flow that keeps the client's address but whose tuple is taken (a clash)
 * gets a port from every unprivileged port, as netfilter's null binding does:
 * no socket of the client can hold it at the destination unseen, since every
 * flow there is tracked, and the wide range keeps remaps cheap when a client
 * with few ports alternates between a Service and its backends, whose
 * server-closed tuples stay taken for TCP_TIME_WAIT_NS. */
#define REMAP_PORT_MIN		1024
#define REMAP_PORT_MAX		65535
