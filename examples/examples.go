// Package examples embeds the example manifests of this directory: the
// Services, EndpointSlices and Node that `sluice demo` runs the agent on.
// They also work with `sluice agent --manifests examples/` on a topology with
// the same addresses.
package examples

import "embed"

// Manifests holds every *.yaml file of the directory.
//
//go:embed *.yaml
var Manifests embed.FS
