package main

import (
	"os"
	"testing"
)

// TestMain lets tests run this binary as the real sluice command (separate
// agent processes for the multi-node tests).
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_AS_BINARY") == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}
