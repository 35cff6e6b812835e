//go:build tools

// Package tools records the etcd commands that scripts/build-runtime builds for
// corral's etcd members, so that `go mod tidy` keeps their dependencies in go.mod and go.sum.
package tools

import (
	_ "go.etcd.io/etcd/etcdctl/v3"
	_ "go.etcd.io/etcd/server/v3"
)
