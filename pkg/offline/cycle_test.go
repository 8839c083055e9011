package offline_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"
	st "k8s.io/kubernetes/pkg/scheduler/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
)

// permitAnswer answers Permit with a set code.
type permitAnswer struct{ code fwk.Code }

func (*permitAnswer) Name() string { return "PermitAnswer" }

func (a *permitAnswer) Permit(context.Context, fwk.CycleState, *v1.Pod, string) (*fwk.Status, time.Duration) {
	return fwk.NewStatus(a.code, "permit says so"), time.Minute
}

// Commit has no binding cycle to wait in: a Permit that waits must fail the
// commit with a reason (AsError is nil for Wait, and a caller that got no pod
// and no error took it for a bind) and bind nothing.
func TestCommitPermitWait(t *testing.T) {
	for _, tc := range []struct {
		code     fwk.Code
		wantBind bool
		wantErr  string
	}{
		{code: fwk.Success, wantBind: true},
		{code: fwk.Wait, wantErr: "Permit: unexpected status Wait"},
		{code: fwk.Unschedulable, wantErr: `Permit: plugin "PermitAnswer" rejected the pod: permit says so`},
	} {
		t.Run(tc.code.String(), func(t *testing.T) {
			node := st.MakeNode().Name("node-1").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", v1.ResourcePods: "10"}).Obj()
			pod := st.MakePod().Name("p").Namespace("default").UID("p").SchedulerName(gpu.SchedulerName).
				Req(map[v1.ResourceName]string{v1.ResourceCPU: "1"}).Obj()
			registry := frameworkruntime.Registry{"PermitAnswer": func(context.Context, runtime.Object, fwk.Handle) (fwk.Plugin, error) {
				return &permitAnswer{code: tc.code}, nil
			}}
			tCtx, cluster, f := shippedFrameworkWith(t, []*v1.Node{node}, nil, fake.NewClientset(pod), func(prof *config.KubeSchedulerProfile) {
				prof.Plugins.Permit.Enabled = append(prof.Plugins.Permit.Enabled, config.Plugin{Name: "PermitAnswer"})
			}, offline.Options{OutOfTree: registry})
			res := offline.Schedule(tCtx, f, cluster, pod)
			if res.Err != nil || res.Node != "node-1" {
				t.Fatalf("Schedule: node %q, err %v", res.Node, res.Err)
			}
			bound, err := offline.Commit(tCtx, f, cluster, pod, res, nil)
			if tc.wantBind != (bound != nil) {
				t.Errorf("bound %v, want a bind: %v", bound != nil, tc.wantBind)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Errorf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Errorf("error %v, want one with %q", err, tc.wantErr)
			}
			// A rejection is one the caller can requeue with its plugin.
			var rejected *offline.Rejected
			if errors.As(err, &rejected) != (tc.code == fwk.Unschedulable) {
				t.Errorf("error %v: a *Rejected %v, want %v", err, rejected != nil, tc.code == fwk.Unschedulable)
			}
			want := 0
			if tc.wantBind {
				want = 1
			}
			if got := len(cluster.Nodes()[0].GetPods()); got != want {
				t.Errorf("%d pods on the node, want %d", got, want)
			}
		})
	}
}

// A cycle whose context ends while the nodes are filtered or scored says
// so: the nodes skipped would read as passes, or as a nameless best.
func TestScheduleCancelled(t *testing.T) {
	nodes := []*v1.Node{
		st.MakeNode().Name("node-1").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", v1.ResourcePods: "10"}).Obj(),
		st.MakeNode().Name("node-2").Capacity(map[v1.ResourceName]string{v1.ResourceCPU: "4", v1.ResourceMemory: "16Gi", v1.ResourcePods: "10"}).Obj(),
	}
	// One node: no Score, the one "feasible" node would be the answer.
	for _, n := range [][]*v1.Node{nodes, nodes[:1]} {
		ctx, cluster, f := shippedFramework(t, n, nil)
		pod := st.MakePod().Name("p").Namespace("default").UID("p").SchedulerName(gpu.SchedulerName).
			Req(map[v1.ResourceName]string{v1.ResourceCPU: "8"}).Obj()
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		res := offline.Schedule(cctx, f, cluster, pod)
		if !errors.Is(res.Err, context.Canceled) || res.Node != "" {
			t.Errorf("%d nodes: node %q, err %v; want no node and %v (the pod fits nowhere: 8 CPUs)", len(n), res.Node, res.Err, context.Canceled)
		}
	}
}
