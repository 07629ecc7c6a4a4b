package agent

// Taking a node over from kube-proxy, and giving it back.
//
// Takeover: kube-proxy's connections are translated by netfilter's NAT.
// Sluice's programs run before netfilter (TC), so once they are attached a
// connection they do not know must still reach netfilter (the datapath sends
// a workload's unknown TCP segments to the stack, and while CFG_ADOPTING is
// set its unknown datagrams too), and once Sluice's Services are programmed
// the agent adopts every such connection: it writes them into Sluice's
// conntrack with netfilter's translation (conntrack.Adopter) and deletes
// netfilter's entry, so that netfilter does not meet the translated packets
// as a second flow clashing with the first. From then on the datapath carries
// them, and kube-proxy can stop and `kube-proxy --cleanup` remove its rules.
//
// Hand-back (HandBack, before Cleanup): the reverse. Sluice's live Service
// flows are written into netfilter's conntrack with their translation
// (ctnetlink create), then the programs are detached at once: kube-proxy,
// started before, finds the connections tracked and leaves them on their
// backends.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/conntrack/netfilter"
	"github.com/sluice-net/sluice/maps"
	"github.com/sluice-net/sluice/nat"
	"github.com/sluice-net/sluice/netlab"
)

// Takeover results, the values of sluice_takeover_flows_total's result label.
const (
	takeoverAdopted        = "adopted"         // now carried by Sluice's datapath
	takeoverNotEstablished = "not_established" // a TCP handshake or close under way: left to netfilter
	takeoverNotAService    = "not_a_service"   // its destination is no Service Sluice programs
	takeoverNodeOwn        = "node_own"        // the node's own socket, translated by netfilter as it leaves
	takeoverTracked        = "already_tracked" // Sluice tracks a flow on its tuple
	takeoverFailed         = "failed"
)

// takeover is the adoption of the connections netfilter translated on the
// node when the agent started.
type takeover struct {
	log     *slog.Logger
	nf      *netfilter.Conn
	local   map[netip.Addr]bool // the namespace's own addresses
	adopter *conntrack.Adopter
	flows   *prometheus.CounterVec
	onFault func(what string)
}

// TakeoverReport counts one pass's flows by result.
type TakeoverReport map[string]int

// checkTakeover looks for connections netfilter translated, before any
// program is attached. With some, it sets CFG_ADOPTING and returns the
// takeover that adopts them once the Services are programmed; with none (a
// node no proxy served), nil. An error reading netfilter is logged, counted
// and returned for /healthz: the agent starts regardless, as it did before
// takeovers existed.
func (a *Agent) checkTakeover(flows *prometheus.CounterVec) (*takeover, error) {
	t := &takeover{log: a.log, flows: flows, local: map[netip.Addr]bool{}}
	var translated []netfilter.Flow
	err := netlab.Enter(a.cfg.Netns, func() error {
		var err error
		if t.nf, err = netfilter.Dial(); err != nil {
			return err
		}
		addrs, err := net.InterfaceAddrs()
		if err != nil {
			return err
		}
		for _, ad := range addrs {
			if p, err := netip.ParsePrefix(ad.String()); err == nil {
				t.local[p.Addr().Unmap()] = true
			}
		}
		translated, err = t.nf.Translated()
		return err
	})
	if err != nil {
		a.log.Warn("takeover: cannot read netfilter's conntrack; connections another proxy balanced may break", "err", err)
		flows.WithLabelValues(takeoverFailed).Inc()
		if t.nf != nil {
			t.nf.Close()
		}
		return nil, err
	}
	if len(translated) == 0 {
		t.nf.Close()
		return nil, nil
	}
	if err := nat.UpdateNodeConfig(a.set, func(c *nat.NodeConfig) { c.Adopting = true }); err != nil {
		a.log.Warn("takeover: cannot leave unknown datagrams to netfilter while adopting", "err", err)
	}
	a.log.Info("taking the node over: netfilter translated connections; adopting them once the Services are programmed",
		"connections", len(translated))
	return t, nil
}

// run adopts the connections once the Services are programmed: a first
// pass, then CFG_ADOPTING is cleared and a second pass takes what netfilter
// translated meanwhile.
func (t *takeover) run(ctx context.Context, programmed <-chan struct{}, set *maps.Set) {
	defer t.nf.Close()
	select {
	case <-ctx.Done():
		return
	case <-programmed:
	}
	for pass := 1; pass <= 2; pass++ {
		if pass == 2 {
			if err := nat.UpdateNodeConfig(set, func(c *nat.NodeConfig) { c.Adopting = false }); err != nil {
				t.log.Error("takeover: cannot clear CFG_ADOPTING; unknown datagrams keep going to netfilter", "err", err)
				t.onFault("clear CFG_ADOPTING: " + err.Error())
			}
		}
		t.adopter.Refresh()
		report, err := t.pass()
		if err != nil {
			t.log.Error("takeover: adoption pass", "pass", pass, "err", err)
			t.onFault(err.Error())
			continue
		}
		t.log.Info("takeover: adopted the connections netfilter translated", "pass", pass,
			"adopted", report[takeoverAdopted], "not_established", report[takeoverNotEstablished],
			"not_a_service", report[takeoverNotAService], "node_own", report[takeoverNodeOwn],
			"already_tracked", report[takeoverTracked], "failed", report[takeoverFailed])
	}
}

// pass adopts what netfilter translated now.
func (t *takeover) pass() (TakeoverReport, error) {
	translated, err := t.nf.Translated()
	if err != nil {
		return nil, err
	}
	report := TakeoverReport{}
	for _, f := range translated {
		result := t.adoptOne(f)
		report[result]++
		t.flows.WithLabelValues(result).Inc()
	}
	return report, nil
}

func (t *takeover) adoptOne(f netfilter.Flow) string {
	switch {
	case !f.Established():
		return takeoverNotEstablished
	case t.local[f.Client.Addr()]:
		// Its packets leave the socket translated by netfilter already;
		// with netfilter's entry deleted, its next packet would be
		// balanced afresh by the rules still there.
		return takeoverNodeOwn
	}
	err := t.adopter.Adopt(conntrack.Adoption{Proto: f.Proto, Client: f.Client, Frontend: f.Frontend, Backend: f.Backend, Source: f.Source})
	switch {
	case errors.Is(err, conntrack.ErrNotAService):
		return takeoverNotAService
	case errors.Is(err, conntrack.ErrTracked):
		return takeoverTracked
	case err != nil:
		t.log.Warn("takeover: cannot adopt a connection", "flow", f.String(), "err", err)
		t.onFault(err.Error())
		return takeoverFailed
	}
	// Sluice translates it now; netfilter's entry would meet the
	// translated packets as a second flow on the same reply tuple and
	// remap its port.
	if err := t.nf.Delete(f); err != nil {
		t.log.Warn("takeover: adopted a connection but cannot delete netfilter's entry", "flow", f.String(), "err", err)
		t.onFault(err.Error())
	}
	return takeoverAdopted
}

// HandBackReport counts the flows HandBack handed to netfilter, and those it
// left out.
type HandBackReport struct {
	HandedBack     int // now tracked by netfilter with their translation
	Untranslated   int // flows no Service balanced: netfilter picks them up as they come
	NotEstablished int // TCP handshakes and closes under way
	DSR            int // answered by direct server return: no translation netfilter could hold
	Failed         int
}

func (r HandBackReport) String() string {
	return fmt.Sprintf("handed %d connections to netfilter (untranslated %d, not established %d, direct server return %d, failed %d)",
		r.HandedBack, r.Untranslated, r.NotEstablished, r.DSR, r.Failed)
}

// ErrNothingToHandBack: no Sluice pins in the directory, so no flows.
var ErrNothingToHandBack = errors.New("no Sluice conntrack pinned")

// handBackTimeouts are the lives given to the flows handed to netfilter:
// its own defaults for established TCP and for an assured UDP stream.
const (
	handBackTCPTimeout = 5 * 24 * time.Hour
	handBackUDPTimeout = 120 * time.Second
)

// HandBack writes the live Service flows of the conntrack pinned in pinDir
// into netfilter's conntrack of the namespace netns ("" for the current
// one), with their translation, so that a netfilter proxy started before
// keeps them on their backends once Sluice's programs are gone. Run Cleanup
// right after it: until the programs are detached, Sluice carries the flows
// on past netfilter. A flow netfilter already tracks (it saw the translated
// packets of one routed by the stack) is replaced.
func HandBack(pinDir, ns string) (HandBackReport, error) {
	var report HandBackReport
	set, err := maps.Open(maps.OpenOptions{PinDir: pinDir, NoCreate: true})
	if err != nil {
		return report, fmt.Errorf("%w in %s: %v", ErrNothingToHandBack, pinDir, err)
	}
	defer set.Close()
	ct, err := maps.Conntrack.In(set)
	if err != nil {
		return report, fmt.Errorf("%w in %s: %v", ErrNothingToHandBack, pinDir, err)
	}
	ct6, _ := maps.Conntrack6.In(set)
	flows, err := conntrack.ListFlows(ct, ct6, conntrack.Monotonic())
	if err != nil {
		return report, err
	}
	var nfc *netfilter.Conn
	if err := netlab.Enter(ns, func() (err error) { nfc, err = netfilter.Dial(); return err }); err != nil {
		return report, err
	}
	defer nfc.Close()
	var errs []error
	for _, f := range flows {
		switch {
		case f.Orphan:
			continue
		case f.ServiceID == 0:
			report.Untranslated++
			continue
		case f.DSR != "":
			report.DSR++
			continue
		case f.Proto == "tcp" && f.State != conntrack.StateEstablished:
			report.NotEstablished++
			continue
		case f.Proto != "tcp" && f.Proto != "udp":
			continue
		}
		nff := netfilter.Flow{Proto: netfilter.ProtoUDP, Client: f.Client, Frontend: f.Frontend, Backend: f.Backend, Source: f.Client}
		timeout := handBackUDPTimeout
		if f.Proto == "tcp" {
			nff.Proto, nff.TCPState, timeout = netfilter.ProtoTCP, netfilter.TCPEstablished, handBackTCPTimeout
		}
		if f.SNAT.IsValid() {
			nff.Source = f.SNAT
		}
		err := nfc.Create(nff, timeout)
		if errors.Is(err, netfilter.ErrExists) {
			// netfilter tracks the translated packets as a flow of
			// their own (source as the backend sees it, to the
			// backend): that entry goes, the translated one takes its
			// place.
			seen := netfilter.Flow{Proto: nff.Proto, Client: nff.Source, Frontend: nff.Backend, Backend: nff.Backend, Source: nff.Source}
			err = errors.Join(nfc.Delete(seen), nfc.Delete(nff))
			if err == nil {
				err = nfc.Create(nff, timeout)
			}
		}
		if err != nil {
			report.Failed++
			errs = append(errs, err)
			continue
		}
		report.HandedBack++
	}
	if len(errs) > 0 {
		return report, fmt.Errorf("%d flows not handed back, the first: %w", len(errs), errs[0])
	}
	return report, nil
}

// newTakeoverMetrics makes sluice_takeover_flows_total, every result at 0.
func newTakeoverMetrics() *prometheus.CounterVec {
	flows := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_takeover_flows_total",
		Help: "Connections netfilter had translated when the agent took the node over, by what became of them " +
			"(adopted: carried on by Sluice's datapath; not_established, not_a_service, node_own, already_tracked: left to netfilter; failed)"},
		[]string{"result"})
	for _, r := range []string{takeoverAdopted, takeoverNotEstablished, takeoverNotAService, takeoverNodeOwn, takeoverTracked, takeoverFailed} {
		flows.WithLabelValues(r)
	}
	return flows
}
