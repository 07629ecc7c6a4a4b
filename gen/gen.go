// Package gen holds the Go bindings and BPF objects generated from ../bpf by
// bpf2go (committed, never edited by hand), and the loader that turns them into
// a running collection.
//
// Regenerate with `go generate ./gen/...` from the repository root (needs clang-19,
// llvm-19 and libbpf-dev; see .ci/install).
package gen

// The multiarch include directories provide <asm/types.h> from linux-libc-dev;
// clang ignores the one that does not exist on this architecture.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -cflags "-O2 -g -mcpu=v3 -Wall -Wextra -Werror -idirafter /usr/include/x86_64-linux-gnu -idirafter /usr/include/aarch64-linux-gnu -I../bpf/include" -type if_stats_key -type if_stats -type fe_key -type fe_value -type fe_flags -type be_key -type be_value -type be_flags -type srcrange_key -type srcrange_value -type aff_key -type aff_value -type ct_key -type ct_value -type ct_type -type ct_flags -type ct_seen -type frag_key -type frag_value -type config -type hostip_key -type hostip_value -type counter -type config_flags -type sock_key -type sock_value -type prefilter_key -type prefilter_value -type failsafe_key -type failsafe_value -type ifstate_key -type ifstate_value -type ifstate_flags -type svcname_key -type svcname_value -type pol_verdict -type rulectr_key -type ipset_key -type ipset_value Sluice ../bpf/sluice.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -g -mcpu=v3 -Wall -Wextra -Werror -idirafter /usr/include/x86_64-linux-gnu -idirafter /usr/include/aarch64-linux-gnu -I../bpf/include" Floor ../bpf/floor.c
