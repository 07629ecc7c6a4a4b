// Package gen holds the Go bindings and BPF objects generated from ../bpf by
// bpf2go (committed, never edited by hand), and the loader that turns them into
// a running collection.
//
// Regenerate with `go generate ./gen/...` from the repository root (needs clang-19,
// llvm-19 and libbpf-dev; see .ci/install).
package gen
