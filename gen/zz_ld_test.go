package gen_test

import (
	"errors"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/gen"
)

func TestLdDump(t *testing.T) {
	_, err := gen.Load(gen.LoadOptions{})
	var ve *ebpf.VerifierError
	if errors.As(err, &ve) {
		l := ve.Log
		if len(l) > 3000000 {
			l = l[len(l)-30:]
		}
		for _, x := range l {
			t.Log(x)
		}
	}
	if err != nil {
		t.Fatal(err)
	}
}
