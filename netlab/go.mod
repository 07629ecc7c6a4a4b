module github.com/sluice-net/sluice/netlab

go 1.26.6

require golang.org/x/sys v0.48.0
