// Package integration runs the scheduler in-process, built as kube-scheduler
// builds it, against a real kube-apiserver and etcd (the local control plane,
// from the pinned modules).
package integration

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

var cluster *harness.Cluster

func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	var err error
	cluster, err = harness.Setup(ctx, "")
	if err != nil {
		fmt.Fprintln(os.Stderr, "integration setup:", err)
		os.Exit(1)
	}
	code := m.Run()
	cancel()
	cluster.Teardown()
	os.Exit(code)
}
