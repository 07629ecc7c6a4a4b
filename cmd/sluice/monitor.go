package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/sluice-net/sluice/conntrack"
	"github.com/sluice-net/sluice/gen"
	"github.com/sluice-net/sluice/maps"
)

// monitorEvent is a flow event as `sluice monitor` prints it: the time on
// the wall clock and the Service by name.
type monitorEvent struct {
	At      time.Time `json:"at"`
	Service string    `json:"service,omitempty"`
	maps.Event
}

// runMonitor prints the datapath's flow events as they come (`sluice
// monitor`), until ctx ends or --count events were printed.
func runMonitor(ctx context.Context, args []string) error {
	f := newInspectFlags("sluice monitor")
	service := f.fs.String("service", "", "only events of this Service (NS/NAME, or NS/NAME:PORT)")
	address := f.fs.String("address", "", "only events with this source, destination or backend address")
	kind := f.fs.String("type", "", "only these events: drop, flow (starts and ends), or a drop reason such as drop_src_range")
	count := f.fs.Int("count", 0, "stop after this many events (0: until interrupted)")
	if err := parseFlags(f.fs, args); err != nil {
		return err
	}
	var addr netip.Addr
	if *address != "" {
		var err error
		if addr, err = netip.ParseAddr(*address); err != nil {
			return fmt.Errorf("--address: %w", err)
		}
	}
	set, err := f.open()
	if err != nil {
		return err
	}
	defer set.Close()
	rd, err := maps.OpenEvents(set)
	if err != nil {
		return err
	}
	defer rd.Close()
	if cfg, err := readConfig(set); err == nil && cfg.EventsPerSec == 0 {
		fmt.Fprintln(os.Stderr, "sluice monitor: the agent writes no flow events (--events-per-second=0)")
	} else if err == nil && cfg.Flags&gen.SluiceConfigFlagsCFG_FLOW_EVENTS == 0 && *kind == "flow" {
		fmt.Fprintln(os.Stderr, "sluice monitor: the agent writes drops only (run it with --flow-events for flow starts and ends)")
	}
	names := map[uint32]string{}
	refreshNames := func() {
		if m, err := maps.SvcNames.In(set); err == nil {
			m.Iterate(func(k gen.SluiceSvcnameKey, v gen.SluiceSvcnameValue) bool {
				names[k.SvcId] = gen.CString(v.Name[:])
				return true
			})
		}
	}
	refreshNames()
	go func() { <-ctx.Done(); rd.Close() }()

	out := io.Writer(os.Stdout)
	enc := json.NewEncoder(out)
	printed := 0
	for *count == 0 || printed < *count {
		e, err := rd.Read()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if _, ok := names[e.ServiceID]; e.ServiceID != 0 && !ok {
			refreshNames() // a Service created since
		}
		ev := monitorEvent{At: wallClock(e.Time), Service: names[e.ServiceID], Event: e}
		if !monitorMatch(ev, *service, addr, *kind) {
			continue
		}
		if *f.asJSON {
			if err := enc.Encode(ev); err != nil {
				return err
			}
		} else {
			line := ev.At.Format("15:04:05.000") + " " + e.String()
			if ev.Service != "" {
				line += " service " + ev.Service
			}
			fmt.Fprintln(out, line)
		}
		printed++
	}
	return nil
}

func monitorMatch(ev monitorEvent, service string, addr netip.Addr, kind string) bool {
	if service != "" && ev.Service != service && !strings.HasPrefix(ev.Service, service+":") {
		return false
	}
	if addr.IsValid() && ev.Src.Addr() != addr && ev.Dst.Addr() != addr && ev.Backend.Addr() != addr {
		return false
	}
	switch kind {
	case "":
		return true
	case "drop":
		return ev.Type == maps.EventDrop
	case "flow":
		return ev.Type == maps.EventFlowStart || ev.Type == maps.EventFlowEnd
	}
	return ev.Reason == kind
}

// wallClock turns a time on the kernel's monotonic clock into wall-clock
// time.
func wallClock(mono time.Duration) time.Time {
	return time.Now().Add(mono - conntrack.Monotonic())
}

func readConfig(set *maps.Set) (gen.SluiceConfig, error) {
	m, err := maps.Config.In(set)
	if err != nil {
		return gen.SluiceConfig{}, err
	}
	c, err := m.Get(0)
	if err != nil {
		return gen.SluiceConfig{}, errors.Join(errors.New("node config"), err)
	}
	return c, nil
}
