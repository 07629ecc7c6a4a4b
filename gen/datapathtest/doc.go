// Package datapathtest holds the datapath's own tests and nothing else, as
// Calico keeps felix/bpf/ut: each loads the programs gen generates into the
// kernel and runs real packets through them, with BPF_PROG_TEST_RUN and
// through veths in network namespaces (gen/bpftest is the harness). They
// live apart from gen, which is the generated code and its loader only.
package datapathtest
