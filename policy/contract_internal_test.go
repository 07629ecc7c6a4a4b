package policy

import (
	"testing"

	"github.com/cilium/ebpf/btf"
	"github.com/sluice-net/sluice/gen/bpftest"
)

// The compiler mirrors the datapath's hand-off (bpf/include/policy.h and
// ifstate.h): the verdict bits, the empty slot, the slot of the verdict
// program, and where skb->cb starts in the kernel's struct __sk_buff. The C
// side is the source of truth; this fails when the two disagree.
func TestCompilerMatchesTheCHeaders(t *testing.T) {
	for name, goValue := range map[string]uint64{
		"POLICY_ALLOW":        verdictAllow,
		"POLICY_DENY":         verdictDeny,
		"IFSTATE_NO_POLICY":   NoPolicy,
		"POLICY_VERDICT_SLOT": 0,
		"POLICY_DIR_SHIFT":    dirShift,
		"POLICY_DIR_INGRESS":  1,
	} {
		if c := bpftest.Define(t, name); c != goValue {
			t.Errorf("%s is %#x in C, %#x in Go", name, c, goValue)
		}
	}
	spec, err := btf.LoadKernelSpec()
	if err != nil {
		t.Fatalf("kernel BTF (the datapath needs it too): %v", err)
	}
	var skb *btf.Struct
	if err := spec.TypeByName("__sk_buff", &skb); err != nil {
		t.Fatal(err)
	}
	for _, m := range skb.Members {
		if m.Name == "cb" {
			if got := m.Offset.Bytes(); got != cbOffset {
				t.Fatalf("struct __sk_buff's cb is at %d, the compiler reads it at %d", got, cbOffset)
			}
			return
		}
	}
	t.Fatal("struct __sk_buff has no cb")
}
