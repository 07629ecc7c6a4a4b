package bpftest

import (
	"fmt"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The legacy ethtool commands that switch a device's checksum offloads
// (include/uapi/linux/ethtool.h); no ethtool binary is needed.
const (
	ethtoolSetRxCsum = 0x15 // ETHTOOL_SRXCSUM
	ethtoolSetTxCsum = 0x17 // ETHTOOL_STXCSUM
)

type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with its data pointer (as golang.org/x/sys/unix
// has it): a pointer the garbage collector and a moving stack see.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte // the rest of struct ifreq's union
}

// SetChecksumOffload switches iface's transmit and receive checksum offloads
// in ns. With transmit off, the kernel completes a CHECKSUM_PARTIAL packet's
// checksum itself before the device sends it (skb_checksum_help); with
// receive off, a veth no longer marks what it receives as verified, so the
// stack checks every checksum. Together, on the two ends of a veth, they make
// a checksum that a program left wrong in either form a dropped packet.
func (ns *NetNS) SetChecksumOffload(tb testing.TB, iface string, tx, rx bool) {
	tb.Helper()
	err := ns.Do(func() error {
		fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		for _, set := range []struct {
			cmd uint32
			on  bool
		}{{ethtoolSetTxCsum, tx}, {ethtoolSetRxCsum, rx}} {
			v := ethtoolValue{cmd: set.cmd}
			if set.on {
				v.data = 1
			}
			req := ifreqData{data: unsafe.Pointer(&v)}
			copy(req.name[:], iface)
			if _, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&req))); errno != 0 {
				return fmt.Errorf("ethtool command %#x on %s: %w", set.cmd, iface, errno)
			}
		}
		return nil
	})
	if err != nil {
		tb.Fatalf("checksum offloads of %s in %s: %v", iface, ns.Name, err)
	}
}
