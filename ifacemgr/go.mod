module github.com/sluice-net/sluice/ifacemgr

go 1.26
