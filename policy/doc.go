// Package policy will own the policy model, the compiler from rules to BPF
// instructions, IP sets, per-rule counters and a reference evaluator in Go.
package policy
