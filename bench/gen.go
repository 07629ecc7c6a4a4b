package bench

// The bench-only programs: the floor (parse and one conntrack lookup, what
// any datapath pays) and the table floor (the same with table hashing),
// against which the datapath's costs are read as ratios, and the sink of
// the packet-rate benchmark. Their C is beside them in
// bpf/; the headers are the datapath's.
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -g -mcpu=v3 -Wall -Wextra -Werror -idirafter /usr/include/x86_64-linux-gnu -idirafter /usr/include/aarch64-linux-gnu -I../bpf/include" Floor bpf/floor.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -g -mcpu=v3 -Wall -Wextra -Werror -idirafter /usr/include/x86_64-linux-gnu -idirafter /usr/include/aarch64-linux-gnu -I../bpf/include" TableFloor bpf/tablefloor.c
//go:generate go tool bpf2go -cc clang-19 -strip llvm-strip-19 -target bpfel -no-global-types -cflags "-O2 -g -mcpu=v3 -Wall -Wextra -Werror -idirafter /usr/include/x86_64-linux-gnu -idirafter /usr/include/aarch64-linux-gnu" Sink bpf/sink.c
