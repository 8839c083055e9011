package fakekubelet

import (
	"context"
	"fmt"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/fleet"
)

// The heartbeat writes what real kubelets write: one lease update per node
// per HeartbeatPeriod (reads and creates only the first time), and each
// node's Ready once per StatusReportPeriod, the same number of nodes on
// every tick; a node whose Ready went stale or false is re-posted at once.
func TestHeartbeatCostsWhatKubeletsDo(t *testing.T) {
	for _, leases := range []bool{true, false} {
		t.Run(fmt.Sprintf("leases=%v", leases), func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			const nodes, slots = 12, 6
			client := fake.NewClientset()
			for i := 0; i < nodes; i++ {
				n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%02d", i), Labels: map[string]string{fleet.LabelFake: "true"}},
					Status: v1.NodeStatus{Conditions: []v1.NodeCondition{fleet.ReadyCondition()}}}
				if i == 5 {
					n.Status.Conditions[0].Status = v1.ConditionFalse
				}
				if _, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			k := New(client)
			k.StatusReportPeriod = slots * heartbeatTick
			if !leases {
				k.HeartbeatPeriod = 0
			}
			k.factory.Start(ctx.Done())
			k.factory.WaitForCacheSync(ctx.Done())
			client.ClearActions()

			readyPerNode := map[string]int{}
			for tick := 0; tick < slots; tick++ {
				k.heartbeat(ctx)
				count := map[string]int{}
				for _, a := range client.Actions() {
					key := a.GetVerb() + " " + a.GetResource().Resource + "/" + a.GetSubresource()
					count[key]++
					if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
						readyPerNode[u.GetObject().(*v1.Node).Name]++
					}
				}
				client.ClearActions()
				// The informer sees n05 Ready before the next tick.
				for t0 := time.Now(); time.Since(t0) < 10*time.Second; time.Sleep(10 * time.Millisecond) {
					if o, ok, _ := k.nodes.GetByKey("n05"); ok && ready(o.(*v1.Node), time.Minute) {
						break
					}
				}
				wantReady := nodes / slots
				if tick == 0 {
					wantReady++ // n05, not Ready, is re-posted at once (its slot is 5)
				}
				if got := count["update nodes/status"]; got != wantReady {
					t.Errorf("tick %d: %d Ready posts, want %d (%v)", tick, got, wantReady, count)
				}
				var want map[string]int
				switch {
				case !leases:
					want = map[string]int{}
				case tick == 0:
					want = map[string]int{"get leases/": nodes, "create leases/": nodes}
				default:
					want = map[string]int{"update leases/": nodes}
				}
				for _, key := range []string{"get leases/", "create leases/", "update leases/"} {
					if count[key] != want[key] {
						t.Errorf("tick %d: %s %d times, want %d", tick, key, count[key], want[key])
					}
				}
			}
			for i := 0; i < nodes; i++ {
				name, want := fmt.Sprintf("n%02d", i), 1
				if name == "n05" {
					want = 2
				}
				if readyPerNode[name] != want {
					t.Errorf("%s: Ready posted %d times in one period, want %d", name, readyPerNode[name], want)
				}
			}
		})
	}
}
