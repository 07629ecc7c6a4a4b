package gen

import (
	"time"

	"golang.org/x/sys/unix"
)

// CString reads a NUL-padded char array of a map value (an interface name,
// a service name).
func CString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}

// PutCString writes s into a char array of a map value, cut to leave room
// for the terminating NUL.
func PutCString(dst []int8, s string) {
	clear(dst)
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}

// Monotonic is the kernel's monotonic clock, which the datapath reads at the
// tick's resolution (sl_now and sl_now_tick in bpf/include/common.h): the
// clock of every timestamp in the maps (conntrack, affinity, fragments). An
// entry's stamp may be up to two ticks (a few ms) behind a Monotonic read
// taken just before.
func Monotonic() time.Duration {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}
