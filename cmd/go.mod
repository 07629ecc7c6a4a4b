module github.com/sluice-net/sluice/cmd

go 1.26
