// Package cmd will hold the sluice binary: flags and wiring of the other modules only.
package cmd
