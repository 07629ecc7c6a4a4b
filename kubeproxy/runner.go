package kubeproxy

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Runner runs a function when triggered, coalescing triggers: at most once per
// MinInterval, at least once per MaxInterval, and again after a failure with
// exponential backoff (from MinInterval, capped at MaxInterval).
type Runner struct {
	clock       clock.Clock
	fn          func() error
	minInterval time.Duration
	maxInterval time.Duration
	trigger     chan struct{}

	mu   sync.Mutex
	runs int
}

// NewRunner returns a runner of fn.
func NewRunner(fn func() error, minInterval, maxInterval time.Duration) *Runner {
	return &Runner{clock: clock.RealClock{}, fn: fn, minInterval: minInterval, maxInterval: maxInterval, trigger: make(chan struct{}, 1)}
}

// WithClock makes the runner keep time with c (tests use a fake clock, as
// kube-proxy's bounded-frequency runner's do). Call it before Run.
func (r *Runner) WithClock(c clock.Clock) *Runner {
	r.clock = c
	return r
}

// Trigger asks for a run; triggers before the run starts count as one.
func (r *Runner) Trigger() {
	select {
	case r.trigger <- struct{}{}:
	default:
	}
}

// Runs counts the runs so far (a run counts once its next timer is set).
func (r *Runner) Runs() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.runs
}

// Run loops until ctx ends.
func (r *Runner) Run(ctx context.Context) {
	var last time.Time
	backoff := time.Duration(0)
	timer := r.clock.NewTimer(r.maxInterval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.trigger:
		case <-timer.C():
		}
		if wait := r.minInterval - r.clock.Since(last); wait > 0 {
			select { // triggers arriving meanwhile are coalesced into this run
			case <-ctx.Done():
				return
			case <-r.clock.After(wait):
			}
		}
		select { // this run covers a trigger that came while waiting
		case <-r.trigger:
		default:
		}
		err := r.fn()
		last = r.clock.Now()
		next := r.maxInterval
		if err != nil {
			backoff = min(max(backoff*2, r.minInterval), r.maxInterval)
			next = backoff
		} else {
			backoff = 0
		}
		if !timer.Stop() {
			select {
			case <-timer.C():
			default:
			}
		}
		timer.Reset(next)
		// Counted once the next timer is set: a test that saw the run
		// may move a fake clock at once.
		r.mu.Lock()
		r.runs++
		r.mu.Unlock()
	}
}
