module github.com/sluice-net/sluice/nat

go 1.26
