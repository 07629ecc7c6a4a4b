/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Where a packet is: the TC hook an entry program runs at (datapath.h). */
#pragma once

enum hook {
	HOOK_FROM_WL,		/* ingress of a workload's host-side veth (leaving the pod) */
	HOOK_TO_WL,		/* egress of a workload's host-side veth (entering the pod) */
	HOOK_FROM_HOST,		/* ingress of a data interface (from outside the node) */
	HOOK_TO_HOST,		/* egress of a data interface (leaving the node) */
};
