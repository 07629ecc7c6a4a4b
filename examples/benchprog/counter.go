// Package benchprog is an example of measuring one's own BPF program with
// Sluice's test harness (gen/bpftest): real packets built by the harness,
// run with BPF_PROG_TEST_RUN, timed in ns/packet beside Sluice's own
// from-workload program on the same packet, as a ratio in one run
// (`go test -bench . ./...` as root).
package benchprog

import (
	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
)

// NewCounter loads a TC program that counts every packet in slot 0 of an
// array map and lets it pass: one's own program, written here with
// cilium/ebpf's assembler so that the example needs no C compiler.
func NewCounter() (*ebpf.Program, *ebpf.Map, error) {
	counts, err := ebpf.NewMap(&ebpf.MapSpec{Name: "counts", Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		return nil, nil, err
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{Name: "counter", Type: ebpf.SchedCLS, License: "GPL",
		Instructions: asm.Instructions{
			asm.StoreImm(asm.RFP, -4, 0, asm.Word), // key 0 on the stack
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, counts.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "pass"),
			asm.Mov.Imm(asm.R1, 1),
			asm.StoreXAdd(asm.R0, asm.R1, asm.DWord),
			asm.Mov.Imm(asm.R0, 0).WithSymbol("pass"), // TC_ACT_OK
			asm.Return(),
		}})
	if err != nil {
		counts.Close()
		return nil, nil, err
	}
	return prog, counts, nil
}
