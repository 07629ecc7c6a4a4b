module github.com/sluice-net/sluice/kubeproxy

go 1.26
