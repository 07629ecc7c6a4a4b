package kubeproxy

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

func TestRunnerRetriesFailuresWithBackoff(t *testing.T) {
	var calls atomic.Int32
	r := NewRunner(func() error {
		if calls.Add(1) <= 3 {
			return errors.New("map full")
		}
		return nil
	}, 10*time.Millisecond, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	r.Trigger()
	deadline := time.Now().Add(2 * time.Second)
	for calls.Load() < 4 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if calls.Load() != 4 {
		t.Fatalf("%d calls: three failures must be retried without a new trigger", calls.Load())
	}
	time.Sleep(100 * time.Millisecond)
	if calls.Load() != 4 {
		t.Fatalf("kept running after success: %d calls", calls.Load())
	}
}

func TestRunnerRunsAtLeastOncePerMaxInterval(t *testing.T) {
	var calls atomic.Int32
	r := NewRunner(func() error { calls.Add(1); return nil }, time.Millisecond, 30*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	r.Run(ctx)
	if n := calls.Load(); n < 3 {
		t.Fatalf("%d runs in 200 ms with a 30 ms max interval", n)
	}
}

// A negative minimum interval: every trigger runs at once.
func TestRunnerWithoutMinimumInterval(t *testing.T) {
	var calls atomic.Int32
	r := NewRunner(func() error { calls.Add(1); return nil }, -1, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go r.Run(ctx)
	start := time.Now()
	for i := range 5 {
		r.Trigger()
		for calls.Load() <= int32(i) {
			if time.Since(start) > time.Second {
				t.Fatalf("%d runs for %d triggers after 1 s", calls.Load(), i+1)
			}
			time.Sleep(time.Millisecond)
		}
	}
}
