package gen_test

import (
	"os"
	"regexp"
	"strconv"
	"testing"

	"github.com/sluice-net/sluice/gen"
)

// Constants the Go side restates from the C headers must say what the C
// says.
func TestConstantsMatchTheC(t *testing.T) {
	src, err := os.ReadFile("../bpf/include/consts.h")
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{
		"SNAT_PORT_MIN_DEFAULT": gen.SNATPortMinDefault,
		"SNAT_PORT_MAX_DEFAULT": gen.SNATPortMaxDefault,
	} {
		m := regexp.MustCompile(`(?m)^#define\s+` + name + `\s+(\d+)\s*$`).FindSubmatch(src)
		if m == nil {
			t.Errorf("consts.h defines no %s", name)
			continue
		}
		if got, _ := strconv.Atoi(string(m[1])); got != want {
			t.Errorf("%s is %d in consts.h, %d in gen", name, got, want)
		}
	}
}
