package bench

import (
	"errors"
	"io"
	"os"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Where a proxied connection's time goes in the datapath: the kernel counts
// each program's runs and their time while run-time statistics are enabled.
// They are enabled through BPF_ENABLE_STATS, which lasts as long as its file
// descriptor and changes no sysctl; but they add two clock reads to every
// program run on the machine, so the connection-rate figures are measured
// without them and these only on request (SLUICE_BENCH_BPF_STATS=1).

// programRun is one program's count of runs and their total time.
type programRun struct {
	name string
	runs uint64
	time time.Duration
}

// enableRunTimeStats turns run-time statistics on until the returned
// closer is closed; nil when SLUICE_BENCH_BPF_STATS is not 1.
func enableRunTimeStats(b *testing.B) io.Closer {
	if os.Getenv("SLUICE_BENCH_BPF_STATS") != "1" {
		return nil
	}
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("BPF_ENABLE_STATS: %v", err)
	}
	return c
}

// programRuns reads the statistics of every loaded program whose name
// starts with prefix, by program ID.
func programRuns(b *testing.B, prefix string) map[ebpf.ProgramID]programRun {
	runs := map[ebpf.ProgramID]programRun{}
	var id ebpf.ProgramID
	for {
		next, err := ebpf.ProgramGetNextID(id)
		if errors.Is(err, os.ErrNotExist) {
			return runs
		}
		if err != nil {
			b.Fatalf("next program after %d: %v", id, err)
		}
		id = next
		prog, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // unloaded meanwhile
		}
		info, err := prog.Info()
		if err != nil || !strings.HasPrefix(info.Name, prefix) {
			prog.Close()
			continue
		}
		stats, err := prog.Stats()
		prog.Close()
		if err != nil {
			b.Fatalf("statistics of program %d (%s): %v", id, info.Name, err)
		}
		runs[id] = programRun{name: info.Name, runs: stats.RunCount, time: stats.Runtime}
	}
}

// programRunsSince sums, by program name, what ran between two readings;
// it returns the totals and the names ordered by time, largest first.
func programRunsSince(before, after map[ebpf.ProgramID]programRun) (total programRun, byName []programRun) {
	sums := map[string]programRun{}
	for id, a := range after {
		d := programRun{name: a.name, runs: a.runs - before[id].runs, time: a.time - before[id].time}
		s := sums[a.name]
		s.name, s.runs, s.time = a.name, s.runs+d.runs, s.time+d.time
		sums[a.name] = s
		total.runs, total.time = total.runs+d.runs, total.time+d.time
	}
	for _, s := range sums {
		if s.runs > 0 {
			byName = append(byName, s)
		}
	}
	sort.Slice(byName, func(i, j int) bool { return byName[i].time > byName[j].time })
	return total, byName
}
