package datapathtest_test

import (
	"testing"

	"github.com/sluice-net/sluice/gen/bpftest"
)

func TestMain(m *testing.M) { bpftest.HelperMain(m) }
