module github.com/sluice-net/sluice/policy

go 1.26
