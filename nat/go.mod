module github.com/sluice-net/sluice/nat

go 1.26

require (
	github.com/sluice-net/sluice/gen v0.0.0
	github.com/sluice-net/sluice/maps v0.0.0
)

replace (
	github.com/sluice-net/sluice/gen => ../gen
	github.com/sluice-net/sluice/maps => ../maps
)
