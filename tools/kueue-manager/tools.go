//go:build tools

// Package tools records the Kueue manager command that scripts/build-kueue
// builds, so that `go mod tidy` keeps its dependencies in go.mod and go.sum.
package tools

import (
	_ "sigs.k8s.io/kueue/cmd/kueue"
)
