// Package bpftest is the harness every privileged Sluice test uses: it decides
// whether the test may run (root with BPF), mounts a private bpffs for pins, and
// creates network namespaces and veth pairs that are removed when the test ends,
// even when it fails.
//
// Without the privilege a test is skipped with a message, unless
// SLUICE_REQUIRE_BPF=1 is set (CI sets it), in which case it fails: CI can never
// pass by skipping.
package bpftest
