package ifacemgr

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Hook is where on an interface a program runs.
type Hook string

// Hooks.
const (
	Ingress Hook = "ingress"
	Egress  Hook = "egress"
	XDP     Hook = "xdp"
)

// Legacy TC: Sluice's cls_bpf filter has this priority and handle on the
// clsact ingress/egress hook; any other filter there is someone else's.
const (
	legacyPriority = 0x5c1 // "slc"
	legacyHandle   = 0x5c1
)

// attacher attaches programs to interfaces of one namespace and remembers each
// attachment by a pin "<ifindex>_<hook>_<ifname>" under dir, so a restarted
// agent finds, checks and keeps what is already right. bpffs refuses dots in
// pin names and interface names may hold them (VLANs: eth0.100), so a dot is
// written as ':', which an interface name cannot contain.
type attacher struct {
	dir    string
	legacy bool // clsact + cls_bpf instead of TCX links
	nl     *netlink.Handle
	// xdpDriverOnly: XDP programs run in driver mode or not at all.
	xdpDriverOnly bool
}

func (a *attacher) pinPath(ifname string, ifindex int, hook Hook) string {
	return filepath.Join(a.dir, fmt.Sprintf("%d_%s_%s", ifindex, hook, strings.ReplaceAll(ifname, ".", ":")))
}

// sameProgram tells whether the program id runs the code of ours (its tag)
// on the very maps ours uses. The same code on other maps — an agent
// restarted after a pin was removed, whose programs read a fresh map while
// the old ones still read the orphaned one — is not ours to keep.
func sameProgram(id ebpf.ProgramID, ours *ebpf.ProgramInfo) bool {
	p, err := ebpf.NewProgramFromID(id)
	if err != nil {
		return false
	}
	defer p.Close()
	info, err := p.Info()
	if err != nil || info.Tag != ours.Tag {
		return false
	}
	theirs, ok1 := info.MapIDs()
	mine, ok2 := ours.MapIDs()
	if !ok1 || !ok2 {
		return false
	}
	theirs, mine = slices.DeleteFunc(theirs, perLoad), slices.DeleteFunc(mine, perLoad)
	slices.Sort(theirs)
	slices.Sort(mine)
	return slices.Equal(theirs, mine)
}

// perLoad tells a map that every load of a program makes its own from the
// maps it shares, so that it never matches another load's:
//   - its read-only data (.rodata: load-time constants such as the Maglev
//     table size). Its contents are the load's options, which show in the
//     maps they size (the Maglev tables' pin is replaced when its size
//     changes);
//   - its global variables (.bss): the datapath's clock cache (sl_clock,
//     bpf/include/common.h), which a load fills again within a tick.
func perLoad(id ebpf.MapID) bool {
	m, err := ebpf.NewMapFromID(id)
	if err != nil {
		return false
	}
	defer m.Close()
	if m.Flags()&unix.BPF_F_RDONLY_PROG != 0 {
		return true
	}
	info, err := m.Info()
	return err == nil && info.Name == ".bss"
}

// ensure makes prog run on the hook. It returns whether it changed anything.
// A pinned link running a program with another tag is updated in place (no
// moment without a program); none is attached anew.
//
// force replaces a link whose program is another instance of the same code
// (SetPrograms after a reload); without it such a link is kept (a restart).
func (a *attacher) ensure(ifname string, ifindex int, hook Hook, prog *ebpf.Program, force bool) (bool, error) {
	if a.legacy && hook != XDP {
		return a.ensureLegacy(ifindex, hook, prog)
	}
	progInfo, err := prog.Info()
	if err != nil {
		return false, err
	}
	progID, _ := progInfo.ID()
	path := a.pinPath(ifname, ifindex, hook)
	if l, err := link.LoadPinnedLink(path, nil); err == nil {
		info, err := l.Info()
		wrongMode := hook == XDP && a.xdpDriverOnly && xdpModeOf(a.nl, ifindex) == XDPGeneric
		if err == nil && linkAlive(info) && !wrongMode {
			defer l.Close()
			if info.Program == progID {
				return false, nil
			}
			if !force && sameProgram(info.Program, progInfo) {
				return false, nil
			}
			if err := l.Update(prog); err != nil {
				return false, fmt.Errorf("replace %s program on %s: %w", hook, ifname, err)
			}
			return true, nil
		}
		// A defunct link (its interface went away and came back), or an
		// XDP program in generic mode where only driver mode will do: drop
		// it, and close it now, so that it is detached before the attach.
		_ = l.Unpin()
		l.Close()
	} else if !errors.Is(err, fs.ErrNotExist) {
		return false, fmt.Errorf("open pin %s: %w", path, err)
	}

	var l link.Link
	switch hook {
	case XDP:
		l, _, err = attachXDP(ifindex, prog, a.xdpDriverOnly)
	default:
		at := ebpf.AttachTCXIngress
		if hook == Egress {
			at = ebpf.AttachTCXEgress
		}
		// At the head: Sluice's verdict comes before other owners' programs.
		l, err = link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: prog, Attach: at, Anchor: link.Head()})
		if errors.Is(err, ebpf.ErrNotSupported) {
			a.legacy = true // a kernel before 6.6: clsact + cls_bpf from now on
			return a.ensureLegacy(ifindex, hook, prog)
		}
	}
	if err != nil {
		return false, fmt.Errorf("attach %s program to %s: %w", hook, ifname, err)
	}
	defer l.Close()
	if err := os.MkdirAll(a.dir, 0o700); err != nil {
		return false, err
	}
	if err := l.Pin(path); err != nil {
		return false, fmt.Errorf("pin %s: %w", path, err)
	}
	return true, nil
}

// attached tells whether the hook runs prog (or the same code on the same
// maps), as ensure left it. Legacy TC filters are not pinned and are checked
// by ensure itself.
func (a *attacher) attached(ifname string, ifindex int, hook Hook, prog *ebpf.Program) bool {
	if a.legacy && hook != XDP {
		return true
	}
	l, err := link.LoadPinnedLink(a.pinPath(ifname, ifindex, hook), nil)
	if err != nil {
		return false
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil || !linkAlive(info) {
		return false
	}
	ours, err := prog.Info()
	if err != nil {
		return false
	}
	if id, _ := ours.ID(); info.Program == id {
		return true
	}
	return sameProgram(info.Program, ours)
}

// linkAlive: the link is still attached to an interface.
func linkAlive(info *link.Info) bool {
	switch info.Type {
	case link.TCXType:
		if tcx := info.TCX(); tcx != nil {
			return tcx.Ifindex != 0
		}
	case link.XDPType:
		if x := info.XDP(); x != nil {
			return x.Ifindex != 0
		}
	}
	return true
}

// detach removes Sluice's program from the hook; other programs stay.
func (a *attacher) detach(ifname string, ifindex int, hook Hook) error {
	if a.legacy && hook != XDP {
		return a.detachLegacy(ifindex, hook)
	}
	return unpinLink(a.pinPath(ifname, ifindex, hook))
}

// unpinLink removes a link's pin; with the last reference gone the kernel
// detaches the program.
func unpinLink(path string) error {
	l, err := link.LoadPinnedLink(path, nil)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		// Not a link we can load: remove the file so it cannot mislead.
		if rerr := os.Remove(path); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
			return fmt.Errorf("remove pin %s: %w", path, rerr)
		}
		return nil
	}
	defer l.Close()
	if err := l.Unpin(); err != nil {
		return fmt.Errorf("unpin %s: %w", path, err)
	}
	return nil
}

// pinnedAttachment is a pin found in the directory.
type pinnedAttachment struct {
	ifname  string
	ifindex int
	hook    Hook
	path    string
}

func (a *attacher) listPins() ([]pinnedAttachment, error) {
	entries, err := os.ReadDir(a.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []pinnedAttachment
	for _, e := range entries {
		parts := strings.SplitN(e.Name(), "_", 3)
		if len(parts) < 3 {
			continue
		}
		idx, err := strconv.Atoi(parts[0])
		if err != nil {
			continue
		}
		out = append(out, pinnedAttachment{ifname: strings.ReplaceAll(parts[2], ":", "."), ifindex: idx,
			hook: Hook(parts[1]), path: filepath.Join(a.dir, e.Name())})
	}
	return out, nil
}

// Legacy TC (kernels before 6.6): a clsact qdisc and one direct-action cls_bpf
// filter with Sluice's priority and handle. Replacing the filter is atomic.

func legacyParent(hook Hook) uint32 {
	if hook == Egress {
		return netlink.HANDLE_MIN_EGRESS
	}
	return netlink.HANDLE_MIN_INGRESS
}

func (a *attacher) ensureLegacy(ifindex int, hook Hook, prog *ebpf.Program) (bool, error) {
	qdisc := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: ifindex,
		Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := a.nl.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return false, fmt.Errorf("add clsact qdisc to ifindex %d: %w", ifindex, err)
	}
	info, err := prog.Info()
	if err != nil {
		return false, err
	}
	id, _ := info.ID()
	filters, err := a.nl.FilterList(&netlink.Device{LinkAttrs: netlink.LinkAttrs{Index: ifindex}}, legacyParent(hook))
	if err != nil {
		return false, fmt.Errorf("list filters of ifindex %d: %w", ifindex, err)
	}
	for _, f := range filters {
		if bf, ok := f.(*netlink.BpfFilter); ok && bf.Priority == legacyPriority && bf.Handle == legacyHandle {
			if bf.Id == int(id) || sameProgram(ebpf.ProgramID(bf.Id), info) {
				return false, nil
			}
		}
	}
	filter := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: legacyParent(hook),
			Handle: legacyHandle, Priority: legacyPriority, Protocol: unix.ETH_P_ALL},
		Fd: prog.FD(), Name: "sluice-" + string(hook), DirectAction: true,
	}
	if err := a.nl.FilterReplace(filter); err != nil {
		return false, fmt.Errorf("attach %s cls_bpf filter to ifindex %d: %w", hook, ifindex, err)
	}
	return true, nil
}

func (a *attacher) detachLegacy(ifindex int, hook Hook) error {
	filter := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{LinkIndex: ifindex, Parent: legacyParent(hook),
		Handle: legacyHandle, Priority: legacyPriority, Protocol: unix.ETH_P_ALL}}
	err := a.nl.FilterDel(filter)
	if err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.ENODEV) && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("remove %s cls_bpf filter from ifindex %d: %w", hook, ifindex, err)
	}
	return nil
}
