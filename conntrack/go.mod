module github.com/sluice-net/sluice/conntrack

go 1.26
