// Package trace runs one described packet through the node's live datapath
// without changing it, and says what the datapath decided: conntrack hit or
// miss, the frontend and why its backend was chosen, NAT, DSR, the policy
// verdict with its rule, drops with their reasons, and the packet that left.
//
// How it changes nothing: the programs are loaded again as a dry run
// (gen.LoadOptions.DryRun) on the live maps that the datapath only reads
// (frontends, backends, Maglev tables, interfaces, policy programs, IP sets)
// and on copies of the maps it writes (conntrack, affinity, fragments,
// counters, per-service counters, events, the IPv4 translation's scratch).
// The packet runs with BPF_PROG_TEST_RUN on the interface's program. A
// policy hand-off reaches the agent's own policy programs and verdict
// program through the live policy program array; the dry run's mark
// (POLICY_DRY_RUN) makes the verdict program return its verdict and write
// nothing, and the rule comes back in the run's context. The one live map
// written is the per-CPU IPv6 scratch (sl_scratch6_v1), where an IPv6
// hand-off leaves its addresses for the policy program: it holds nothing
// from one packet to the next.
package trace

import (
	"fmt"
	stdmaps "maps"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// Packet is the packet to trace.
type Packet struct {
	Proto    string // "tcp" or "udp"
	Src, Dst netip.AddrPort
	// TCPFlags: "syn" (the default), "ack", "fin", "rst", or a
	// comma-separated mix ("syn,ack").
	TCPFlags string
	Payload  []byte
	// Iface is the interface the packet meets; Egress: leaving the node
	// (or entering the pod) through it rather than arriving.
	Iface  string
	Egress bool
	// XDP names the XDP program on Iface (ifacemgr.Interface.XDPProgram:
	// sl_xdp_prefilter or sl_xdp_accel), which an arriving packet meets
	// before TC; "" for none.
	XDP string
}

// Result is what the datapath did with the packet.
type Result struct {
	Program string `json:"program"`
	// Verdict: "pass", "drop", "redirect" (a reply sent back, routed by
	// the FIB, or handed to a pod of this node: local delivery), or, at
	// XDP, "xdp_tx" (translated and sent back out of the interface it
	// came in by) and "xdp_redirect" (to another interface).
	Verdict string `json:"verdict"`
	// XDP is what the XDP program decided before TC, when one ran: the
	// acceleration's decision (sluice_xdp_packets_total's: tx,
	// pass_no_flow, ...), or the prefilter's pass or drop.
	XDP    string   `json:"xdp,omitempty"`
	Input  string   `json:"input"`
	Output string   `json:"output,omitempty"`
	Steps  []string `json:"steps"`
	// Conntrack: "miss" or the entry the packet hit.
	Conntrack string `json:"conntrack"`
	// Frontend names the Service and its frontend, when the destination is
	// one.
	Frontend string `json:"frontend,omitempty"`
	Backend  string `json:"backend,omitempty"`
	// Why the backend: affinity, local only, Maglev, random.
	Why    string `json:"why,omitempty"`
	SNAT   string `json:"snat,omitempty"`
	DSR    bool   `json:"dsr,omitempty"`
	Policy string `json:"policy,omitempty"`
	// Counters the run moved (drop reasons and other verdicts).
	Counters map[string]uint64 `json:"counters,omitempty"`
	// Flows the run created (in the copy).
	Flows []string `json:"flows,omitempty"`
}

// The maps the datapath writes, copied for the run: with their entries
// (state the packet may meet), or empty (what the run adds is its own); and
// sl_spanwriter_v1, which the run's load fills with its own writer.
var (
	copiedWithEntries = []string{gen.SluiceMapSlCtV2, gen.SluiceMapSlCt6V1, gen.SluiceMapSlAffV1, gen.SluiceMapSlAff6V1,
		gen.SluiceMapSlFragV1, gen.SluiceMapSlFrag6V1, gen.SluiceMapSlSockV1, gen.SluiceMapSlSock6V1,
		gen.SluiceMapSlSnatfullV1, gen.SluiceMapSlSnatfull6V1}
	copiedEmpty = []string{gen.SluiceMapSlCountersV7, gen.SluiceMapSlSvcstatsV1, gen.SluiceMapSlEventsV1,
		gen.SluiceMapSlEvcpuV1, gen.SluiceMapSlRulectrV1, gen.SluiceMapSlPortcrowdV1, gen.SluiceMapSlSpanV1, gen.SluiceMapSlSpan6V1, gen.SluiceMapSlRouteV1,
		gen.SluiceMapSlRoute6V1, gen.SluiceMapSlSpanwriterV1, gen.SluiceMapSlXdpstatsV2}
)

// POLICY_* bits of cb[3] (bpf/include/policy.h).
const (
	policyAllow  = 1 << 28
	policyDeny   = 1 << 29
	policyDryRun = 1 << 26
)

// Run traces pkt through the datapath whose maps are set.
func Run(set *maps.Set, pkt Packet) (*Result, error) {
	iface, err := net.InterfaceByName(pkt.Iface)
	if err != nil {
		return nil, fmt.Errorf("trace: interface %q: %w", pkt.Iface, err)
	}
	if len(iface.HardwareAddr) == 0 {
		return nil, fmt.Errorf("trace: %s has no Ethernet header: only Ethernet interfaces' programs can be run", pkt.Iface)
	}
	frame, err := build(pkt)
	if err != nil {
		return nil, err
	}
	ifstate, err := maps.IfState.In(set)
	if err != nil {
		return nil, err
	}
	st, err := ifstate.Get(gen.SluiceIfstateKey{Ifindex: uint32(iface.Index)})
	if err != nil {
		return nil, fmt.Errorf("trace: %s is not an interface Sluice manages", pkt.Iface)
	}

	replace, closeCopies, err := copies(set)
	if err != nil {
		return nil, err
	}
	defer closeCopies()
	size, err := maps.MaglevTableSize(set)
	if err != nil {
		return nil, err
	}
	objs, err := gen.Load(gen.LoadOptions{Maps: replace, DryRun: true, MaglevTableSize: size})
	if err != nil {
		return nil, fmt.Errorf("trace: %w", err)
	}
	defer objs.Close()

	workload := st.Flags&gen.SluiceIfstateFlagsIFS_WORKLOAD != 0
	prog, name := objs.SlFromHost, "sl_from_host"
	switch {
	case workload && !pkt.Egress:
		prog, name = objs.SlFromWl, "sl_from_wl"
	case workload:
		prog, name = objs.SlToWl, "sl_to_wl"
	case pkt.Egress:
		prog, name = objs.SlToHost, "sl_to_host"
	}
	r := &Result{Program: name, Input: summary(frame)}
	programs := name
	if !workload && !pkt.Egress && pkt.XDP != "" {
		programs = pkt.XDP + " (XDP), then " + name
	}
	r.step("%s on %s (%s): %s", r.Input, pkt.Iface, map[bool]string{false: "ingress", true: "egress"}[pkt.Egress], programs)

	ct := replace[gen.SluiceMapSlCtV2]
	ct6 := replace[gen.SluiceMapSlCt6V1]
	before, err := flowSet(ct, ct6)
	if err != nil {
		return nil, err
	}
	r.conntrack(before, pkt)
	r.frontend(set, pkt, workload)
	affBefore := affinity(replace, pkt)

	if !workload && !pkt.Egress && pkt.XDP != "" {
		done, err := r.xdp(objs, replace, pkt, iface.Index, frame)
		if err != nil {
			return r, err
		}
		if done {
			return r, r.settle(replace, pkt, before, affBefore)
		}
	}

	ctxIn := skBuff{Ifindex: uint32(iface.Index)}
	if !pkt.Egress {
		ctxIn.IngressIfindex = uint32(iface.Index)
	}
	var ctxOut skBuff
	out := make([]byte, len(frame)+256)
	opts := ebpf.RunOptions{Data: frame, DataOut: out, Context: ctxIn, ContextOut: &ctxOut}
	ret, err := prog.Run(&opts)
	if err != nil {
		return nil, fmt.Errorf("trace: run %s: %w", name, err)
	}
	out = opts.DataOut
	switch ret {
	case 0:
		r.Verdict = "pass"
	case 2:
		r.Verdict = "drop"
	case 7:
		r.Verdict = "redirect"
	default:
		r.Verdict = "verdict " + strconv.Itoa(int(ret))
	}
	if ret != 2 {
		r.Output = summary(out)
	}

	r.policy(ctxOut)
	if err := r.settle(replace, pkt, before, affBefore); err != nil {
		return nil, err
	}
	switch {
	case ret == 7 && (strings.Contains(r.Output, "RST") || strings.Contains(r.Output, "icmp")):
		r.step("answered: %s, sent back out of %s", r.Output, pkt.Iface)
	case ret == 7 && r.Counters["local_delivered"] > 0:
		r.step("handed to the destination pod's interface, past the node's stack (local delivery): %s", r.Output)
	case ret == 7:
		r.step("redirected (routed by the FIB): %s", r.Output)
	case ret == 2:
		r.step("dropped")
	default:
		r.step("passed: %s", r.Output)
	}
	return r, nil
}

// settle reports what the run left behind, after XDP or TC: the flows it
// started (their backend, why, SNAT or DSR) and the counters it moved.
func (r *Result) settle(replace map[string]*ebpf.Map, pkt Packet, before map[string]conntrack.Flow, affBefore string) error {
	after, err := flowSet(replace[gen.SluiceMapSlCtV2], replace[gen.SluiceMapSlCt6V1])
	if err != nil {
		return err
	}
	r.newFlows(before, after, affBefore, affinity(replace, pkt))
	if r.Counters, err = counters(replace[gen.SluiceMapSlCountersV7]); err != nil {
		return err
	}
	for _, c := range slices.Sorted(stdmaps.Keys(r.Counters)) {
		r.step("counted %s", c)
	}
	return nil
}

// The XDP verdicts (enum xdp_action).
const (
	xdpDrop     = 1
	xdpPass     = 2
	xdpTX       = 3
	xdpRedirect = 4
)

// xdp runs the interface's XDP program on the frame; done when the frame
// does not go on to TC.
func (r *Result) xdp(objs *gen.SluiceObjects, replace map[string]*ebpf.Map, pkt Packet, ifindex int, frame []byte) (bool, error) {
	var prog *ebpf.Program
	switch pkt.XDP {
	case "sl_xdp_accel":
		prog = objs.SlXdpAccel
	case "sl_xdp_prefilter":
		prog = objs.SlXdpPrefilter
	default:
		return false, fmt.Errorf("trace: XDP program %q on %s: want sl_xdp_accel or sl_xdp_prefilter", pkt.XDP, pkt.Iface)
	}
	out := make([]byte, len(frame)+256)
	opts := ebpf.RunOptions{Data: frame, DataOut: out, Context: gen.XDPContext{DataEnd: uint32(len(frame)), IngressIfindex: uint32(ifindex)}}
	ret, err := prog.Run(&opts)
	if err != nil {
		return false, fmt.Errorf("trace: run %s: %w", pkt.XDP, err)
	}
	// The acceleration counts each packet by its decision; the prefilter
	// before it counts none (its drop, or the prefilter program alone).
	if pkt.XDP == "sl_xdp_accel" {
		if r.XDP, err = xdpDecision(replace[gen.SluiceMapSlXdpstatsV2]); err != nil {
			return false, err
		}
	}
	if r.XDP == "" {
		r.XDP = map[bool]string{true: "drop", false: "pass"}[ret == xdpDrop]
	}
	switch ret {
	case xdpPass:
		r.step("%s passed it to TC (XDP decision %s)", pkt.XDP, r.XDP)
		return false, nil
	case xdpDrop:
		r.Program, r.Verdict = pkt.XDP, "drop"
		if r.XDP == "dropped" {
			r.step("%s refused the new flow, as TC would (its reason is among the counters)", pkt.XDP)
		} else {
			r.step("%s dropped it: the source is denied (sl_prefilter_v1) and the port is not a failsafe one", pkt.XDP)
		}
	case xdpTX, xdpRedirect:
		r.Program, r.Output = pkt.XDP, summary(opts.DataOut)
		r.Verdict = map[uint32]string{xdpTX: "xdp_tx", xdpRedirect: "xdp_redirect"}[ret]
		r.step("%s translated it and sent it (%s): %s", pkt.XDP, r.Verdict, r.Output)
	default:
		r.Program, r.Verdict = pkt.XDP, "xdp verdict "+strconv.Itoa(int(ret))
	}
	return true, nil
}

// xdpDecision names the decision the run counted in the (copied) decisions
// map, or "" when it counted none.
func xdpDecision(m *ebpf.Map) (string, error) {
	names, err := maps.XDPDecisionNames()
	if err != nil {
		return "", err
	}
	pc, err := maps.NewPerCPUMap[gen.SluiceXdpAccelDecision, uint64](m)
	if err != nil {
		return "", err
	}
	counts, err := maps.ReadXDPDecisions(pc, names)
	if err != nil {
		return "", err
	}
	for name, n := range counts {
		if n != 0 {
			return name, nil
		}
	}
	return "", nil
}

func (r *Result) step(format string, args ...any) {
	r.Steps = append(r.Steps, fmt.Sprintf(format, args...))
}

// skBuff is struct __sk_buff (192 bytes: a run's context comes back whole
// or not at all); a run sets ifindex and ingress_ifindex and reads cb back.
type skBuff struct {
	Len, PktType, Mark, QueueMapping, Protocol, VlanPresent, VlanTCI, VlanProto, Priority uint32
	IngressIfindex, Ifindex, TCIndex                                                      uint32
	Cb                                                                                    [5]uint32
	Rest                                                                                  [124]byte
}

// copies makes the maps a run writes, and returns every map the programs
// use: the copies, and the live ones they only read.
func copies(set *maps.Set) (map[string]*ebpf.Map, func(), error) {
	out := map[string]*ebpf.Map{}
	var made []*ebpf.Map
	closeAll := func() {
		for _, m := range made {
			m.Close()
		}
	}
	for name, m := range set.All() {
		out[name] = m
	}
	for _, name := range append(slices.Clone(copiedWithEntries), copiedEmpty...) {
		live := set.Map(name)
		if live == nil {
			continue
		}
		c, err := maps.Clone(live, slices.Contains(copiedWithEntries, name))
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("trace: copy %s: %w", name, err)
		}
		made = append(made, c)
		out[name] = c
	}
	return out, closeAll, nil
}

// flowSet reads every flow of the (copied) conntrack maps, by key.
func flowSet(ct, ct6 *ebpf.Map) (map[string]conntrack.Flow, error) {
	m, err := maps.NewMap[gen.SluiceCtKey, gen.SluiceCtValue](ct)
	if err != nil {
		return nil, err
	}
	m6, err := maps.NewMap[conntrack.Key, conntrack.Entry](ct6)
	if err != nil {
		return nil, err
	}
	flows, err := conntrack.ListFlows(m, m6, conntrack.Monotonic())
	if err != nil {
		return nil, err
	}
	out := make(map[string]conntrack.Flow, len(flows))
	for _, f := range flows {
		out[f.Proto+" "+f.Client.String()+" "+f.Frontend.String()] = f
	}
	return out, nil
}

// conntrack says whether the packet's tuple, or its reverse, is tracked.
func (r *Result) conntrack(flows map[string]conntrack.Flow, pkt Packet) {
	r.Conntrack = "miss"
	for _, f := range flows {
		if f.Proto != pkt.Proto {
			continue
		}
		switch {
		case f.Client == pkt.Src && f.Frontend == pkt.Dst:
			r.Conntrack = "hit: the flow " + f.String()
		case f.Backend == pkt.Src && (f.Client == pkt.Dst || f.SNAT == pkt.Dst):
			r.Conntrack = "hit: a reply of the flow " + f.String()
		default:
			continue
		}
		break
	}
	r.step("conntrack %s", r.Conntrack)
}

// frontend describes the Service whose frontend the destination is.
func (r *Result) frontend(set *maps.Set, pkt Packet, workload bool) {
	fe, id, ok := lookupFrontend(set, pkt)
	if !ok {
		return
	}
	var flags []string
	external := fe.Flags&gen.SluiceFeFlagsFE_EXTERNAL != 0
	if external {
		flags = append(flags, "external")
	}
	if fe.Flags&gen.SluiceFeFlagsFE_INT_LOCAL != 0 {
		flags = append(flags, "internalTrafficPolicy Local")
	}
	if fe.Flags&gen.SluiceFeFlagsFE_EXT_LOCAL != 0 {
		flags = append(flags, "externalTrafficPolicy Local")
	}
	if fe.Flags&gen.SluiceFeFlagsFE_MAGLEV != 0 {
		flags = append(flags, "Maglev")
	}
	if fe.AffinityTimeout != 0 {
		flags = append(flags, fmt.Sprintf("affinity %ds", fe.AffinityTimeout))
	}
	r.Frontend = fmt.Sprintf("%s/%s: %s (%d backends", pkt.Dst, pkt.Proto, serviceName(set, id), fe.Count)
	if fe.Flags&(gen.SluiceFeFlagsFE_INT_LOCAL|gen.SluiceFeFlagsFE_EXT_LOCAL) != 0 {
		r.Frontend += fmt.Sprintf(", %d on this node", fe.LocalCount)
	}
	r.Frontend += ")"
	if len(flags) > 0 {
		r.Frontend += " [" + strings.Join(flags, ", ") + "]"
	}
	r.step("frontend %s", r.Frontend)
	localOnly := fe.Flags&gen.SluiceFeFlagsFE_INT_LOCAL != 0 || (!workload && !pkt.Egress && fe.Flags&gen.SluiceFeFlagsFE_EXT_LOCAL != 0)
	switch {
	case fe.AffinityTimeout != 0:
		r.Why = "session affinity"
	case localOnly:
		r.Why = fmt.Sprintf("at random among the %d local backends (traffic policy Local)", fe.LocalCount)
	case fe.Flags&gen.SluiceFeFlagsFE_MAGLEV != 0:
		r.Why = fmt.Sprintf("by the Maglev table (the same pick on every node), among %d", fe.Count)
	default:
		r.Why = fmt.Sprintf("at random among %d", fe.Count)
	}
}

// lookupFrontend finds the destination's frontend: exact, or the NodePort
// wildcard on a node address.
func lookupFrontend(set *maps.Set, pkt Packet) (gen.SluiceFeValue, uint32, bool) {
	proto := map[string]uint8{"tcp": 6, "udp": 17}[pkt.Proto]
	if pkt.Dst.Addr().Is4() {
		fe, err := maps.Frontends.In(set)
		if err != nil {
			return gen.SluiceFeValue{}, 0, false
		}
		for _, a := range []netip.Addr{pkt.Dst.Addr(), netip.AddrFrom4([4]byte{255, 255, 255, 255})} {
			if v, err := fe.Get(gen.SluiceFeKey{Addr: gen.NetAddr(a), Port: gen.NetPort(pkt.Dst.Port()), Proto: proto}); err == nil {
				return v, v.SvcId, true
			}
		}
		return gen.SluiceFeValue{}, 0, false
	}
	fe, err := maps.Frontends6.In(set)
	if err != nil {
		return gen.SluiceFeValue{}, 0, false
	}
	all := netip.AddrFrom16([16]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	for _, a := range []netip.Addr{pkt.Dst.Addr(), all} {
		if v, err := fe.Get(gen.SluiceFe6Key{Addr: gen.NetAddr6(a), Port: gen.NetPort(pkt.Dst.Port()), Proto: proto}); err == nil {
			return v, v.SvcId, true
		}
	}
	return gen.SluiceFeValue{}, 0, false
}

func serviceName(set *maps.Set, id uint32) string {
	if m, err := maps.SvcNames.In(set); err == nil {
		if v, err := m.Get(gen.SluiceSvcnameKey{SvcId: id}); err == nil {
			return gen.CString(v.Name[:])
		}
	}
	return fmt.Sprintf("service id %d", id)
}

// affinity reads the client's affinity entry for the frontend's service in
// the copy: its backend, "" when none.
func affinity(replace map[string]*ebpf.Map, pkt Packet) string {
	var out []string
	if pkt.Src.Addr().Is4() {
		var k gen.SluiceAffKey
		var v gen.SluiceAffValue
		it := replace[gen.SluiceMapSlAffV1].Iterate()
		for it.Next(&k, &v) {
			if gen.AddrFromNet(k.Client) == pkt.Src.Addr() {
				out = append(out, fmt.Sprintf("%d:%v", k.SvcId, gen.AddrFromNet(v.Addr)))
			}
		}
	} else {
		var k gen.SluiceAff6Key
		var v gen.SluiceAff6Value
		it := replace[gen.SluiceMapSlAff6V1].Iterate()
		for it.Next(&k, &v) {
			if gen.AddrFromNet6(k.Client) == pkt.Src.Addr() {
				out = append(out, fmt.Sprintf("%d:%v", k.SvcId, gen.AddrFromNet6(v.Addr)))
			}
		}
	}
	slices.Sort(out)
	return strings.Join(out, ",")
}

// policy reads the verdict a policy program left in the run's context.
func (r *Result) policy(ctx skBuff) {
	if ctx.Cb[3]&policyDryRun == 0 {
		return
	}
	verdict := "allowed"
	if ctx.Cb[3]&policyAllow == 0 {
		verdict = "denied"
		if ctx.Cb[3]&policyDeny == 0 {
			verdict = "denied (no policy program in the interface's slot)"
		}
	}
	r.Policy = fmt.Sprintf("%s by rule %s", verdict, maps.RuleName(ctx.Cb[4]))
	r.step("policy: %s", r.Policy)
}

// newFlows reports the flows the run created: backend, SNAT, DSR.
func (r *Result) newFlows(before, after map[string]conntrack.Flow, affBefore, affAfter string) {
	for _, k := range slices.Sorted(stdmaps.Keys(after)) {
		f := after[k]
		if _, ok := before[k]; ok {
			continue
		}
		r.Flows = append(r.Flows, f.String())
		r.step("new flow: %s", f)
		if f.ServiceID == 0 {
			continue
		}
		r.Backend = f.Backend.String()
		if r.Why == "session affinity" {
			if affBefore != "" && affBefore == affAfter {
				r.Why = "session affinity: the client's backend, kept"
			} else {
				r.Why = "session affinity: a new pick, remembered for the client"
			}
		}
		r.step("backend %s, %s", r.Backend, r.Why)
		if f.SNAT.IsValid() {
			r.SNAT = f.SNAT.String()
			r.step("SNAT to %s", r.SNAT)
		}
		if f.DSR == conntrack.DSRSent {
			r.DSR = true
			r.step("direct server return: the frontend rides to %s's node in the DSR option", r.Backend)
		}
	}
}

func counters(m *ebpf.Map) (map[string]uint64, error) {
	names, err := maps.CounterNames()
	if err != nil {
		return nil, err
	}
	pc, err := maps.NewPerCPUMap[gen.SluiceCounter, uint64](m)
	if err != nil {
		return nil, err
	}
	all, err := maps.ReadCounters(pc, names)
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for name, n := range all {
		if n != 0 && !strings.HasPrefix(name, "events_") {
			out[name] = n
		}
	}
	return out, nil
}
