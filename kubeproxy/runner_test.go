package kubeproxy

import (
	"context"
	"errors"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// fakeRunner runs fn under a fake clock; the tests move time themselves.
type fakeRunner struct {
	t     *testing.T
	r     *Runner
	clock *clocktesting.FakeClock
	calls atomic.Int32
}

func newFakeRunner(t *testing.T, fn func(call int32) error, minInterval, maxInterval time.Duration) *fakeRunner {
	f := &fakeRunner{t: t, clock: clocktesting.NewFakeClock(time.Unix(1_000_000, 0))}
	f.r = NewRunner(func() error { return fn(f.calls.Add(1)) }, minInterval, maxInterval).WithClock(f.clock)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go f.r.Run(ctx)
	return f
}

// settle waits until the runner has made n runs and set its next timer, so
// that the next Step reaches that timer; it fails if a run more was made.
func (f *fakeRunner) settle(n int32) {
	f.t.Helper()
	for deadline := time.Now().Add(5 * time.Second); int32(f.r.Runs()) != n || f.calls.Load() != n || !f.clock.HasWaiters(); runtime.Gosched() {
		if time.Now().After(deadline) || f.calls.Load() > n {
			f.t.Fatalf("%d calls (%d runs counted), want %d", f.calls.Load(), f.r.Runs(), n)
		}
	}
}

func TestRunnerRetriesFailuresWithBackoff(t *testing.T) {
	f := newFakeRunner(t, func(call int32) error {
		if call <= 3 {
			return errors.New("map full")
		}
		return nil
	}, 10*time.Millisecond, time.Hour)
	f.r.Trigger()
	f.settle(1)
	// Failures are retried without a trigger, 10, 20 then 40 ms later.
	for i, backoff := range []time.Duration{10, 20, 40} {
		f.clock.Step(backoff*time.Millisecond - time.Nanosecond)
		f.settle(int32(i + 1)) // not yet
		f.clock.Step(time.Nanosecond)
		f.settle(int32(i + 2))
	}
	// After the success, nothing until the maximum interval.
	f.clock.Step(59 * time.Minute)
	f.settle(4)
	f.clock.Step(time.Minute)
	f.settle(5)
}

func TestRunnerRunsAtLeastOncePerMaxInterval(t *testing.T) {
	f := newFakeRunner(t, func(int32) error { return nil }, time.Millisecond, 30*time.Millisecond)
	f.settle(0)
	for n := range int32(3) {
		f.clock.Step(30 * time.Millisecond)
		f.settle(n + 1)
	}
}

// Triggers within the minimum interval after a run are coalesced into one
// run at its end.
func TestRunnerCoalescesWithinMinInterval(t *testing.T) {
	f := newFakeRunner(t, func(int32) error { return nil }, 100*time.Millisecond, time.Hour)
	f.r.Trigger()
	f.settle(1)
	for range 3 {
		f.r.Trigger()
	}
	f.clock.Step(99 * time.Millisecond)
	f.settle(1)
	f.clock.Step(time.Millisecond)
	f.settle(2)
	f.clock.Step(time.Second) // the triggers were all covered by that run
	f.settle(2)
}

// A negative minimum interval: every trigger runs at once, with no time
// passing.
func TestRunnerWithoutMinimumInterval(t *testing.T) {
	f := newFakeRunner(t, func(int32) error { return nil }, -1, time.Hour)
	for i := range int32(5) {
		f.r.Trigger()
		f.settle(i + 1)
	}
}
