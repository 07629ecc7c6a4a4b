module github.com/sluice-net/sluice/bench

go 1.26
