module github.com/sluice-net/sluice/examples

go 1.26.0
