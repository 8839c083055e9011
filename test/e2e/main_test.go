// Package e2e tests the built gpu-scheduler binary against a cluster.
//
// With no E2E_KUBECONFIG, it starts the local control plane (etcd and
// kube-apiserver built from the pinned modules), runs bin/gpu-scheduler as
// processes with the shipped configuration and the ServiceAccount's RBAC, and
// the vanilla kube-scheduler v1.37.2 beside it. With E2E_KUBECONFIG (kind, see
// hack/e2e-kind.sh) it expects manifests/ to be deployed and drives the
// Deployment. Both run the same tests.
package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	configv1 "k8s.io/kube-scheduler/config/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

var (
	cluster *harness.Cluster
	scheds  harness.GPUSchedulers
	procs   *harness.Processes // process mode only
	vanilla *localcp.Scheduler // local only; on kind the cluster has its own
)

const vanillaConfig = `apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
leaderElection:
  leaderElect: false
`

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	kubeconfig := os.Getenv("E2E_KUBECONFIG")
	var err error
	cluster, err = harness.Setup(ctx, kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	defer cluster.Teardown()
	if err := cluster.ApplyAdmissionPolicy(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "e2e setup:", err)
		return 1
	}
	if kubeconfig == "" {
		// The suite's shares are on nodes without a device agent: it
		// tests the accounting (the integration suite has HAMi's nodes).
		// The local control plane serves the Workload API: the suite runs
		// with GenericWorkload on, as an operator who uses gangs would.
		procs, err = harness.StartProcesses(ctx, cluster, 1, func(c *configv1.KubeSchedulerConfiguration) {
			harness.FastLeaderElection(c)
			harness.AccountingOnlySharing(c)
		}, "--feature-gates=GenericWorkload=true", os.Getenv("E2E_SCHEDULER_ARGS"))
		if err != nil {
			fmt.Fprintln(os.Stderr, "starting gpu-scheduler:", err)
			return 1
		}
		defer procs.Stop()
		scheds = procs
		kc, err := cluster.CP.WriteKubeconfig(localcp.UserKubeScheduler, filepath.Join(cluster.Dir, "kube-scheduler.kubeconfig"))
		if err == nil {
			vanilla, err = localcp.StartScheduler(ctx, localcp.SchedulerOptions{
				Name: "kube-scheduler", Binary: filepath.Join(harness.KubeBinDir(), "kube-scheduler"),
				Config: []byte(vanillaConfig), Kubeconfig: kc, Dir: cluster.Dir,
			})
		}
		if err == nil {
			err = vanilla.WaitHealthy(ctx, time.Minute)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, "starting the vanilla kube-scheduler:", err)
			return 1
		}
		defer vanilla.Stop(10 * time.Second)
		if _, err := procs.WaitLeader(ctx, time.Minute); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
	} else {
		scheds = &harness.Deployment{C: cluster}
	}
	code := m.Run()
	writeFigures()
	if code != 0 {
		fmt.Fprintf(os.Stderr, "scheduler logs:\n%s\nlogs and configs kept in %s\n", scheds.Logs(), cluster.Dir)
		os.Setenv("LOCALCP_KEEP", "1")
	}
	return code
}
