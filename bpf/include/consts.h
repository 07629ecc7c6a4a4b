/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Default map capacities. Userspace may override them when it creates the maps
 * (maps.OpenOptions); the programs never depend on the exact number. */
#pragma once

#define SL_IFSTATS_MAX 1024
