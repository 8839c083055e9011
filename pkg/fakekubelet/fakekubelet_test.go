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
// node's Ready once per StatusReportPeriod, about the same number of nodes
// on every tick; a node whose Ready is false or stale is posted at once.
func TestHeartbeatCostsWhatKubeletsDo(t *testing.T) {
	const nodes, slots = 120, 6
	for _, tc := range []struct {
		name   string
		period time.Duration
		// ticks on which leases are renewed
		leaseTicks map[int]bool
	}{
		{"leases every tick", 10 * time.Second, map[int]bool{0: true, 1: true, 2: true, 3: true, 4: true, 5: true}},
		{"leases every third tick", 30 * time.Second, map[int]bool{0: true, 3: true}},
		{"no leases", 0, map[int]bool{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			client := fake.NewClientset()
			for i := 0; i < nodes; i++ {
				n := &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("n%03d", i), Labels: map[string]string{fleet.LabelFake: "true"}},
					Status: v1.NodeStatus{Conditions: []v1.NodeCondition{fleet.ReadyCondition()}}}
				switch i {
				case 5:
					n.Status.Conditions[0].Status = v1.ConditionFalse
				case 7:
					n.Status.Conditions[0].LastHeartbeatTime = metav1.NewTime(time.Now().Add(-10 * time.Minute))
				}
				if _, err := client.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			k := New(client)
			k.StatusReportPeriod, k.HeartbeatPeriod = slots*heartbeatTick, tc.period
			clock := time.Now()
			k.now = func() time.Time { return clock }
			k.factory.Start(ctx.Done())
			k.factory.WaitForCacheSync(ctx.Done())
			client.ClearActions()

			readyPerNode := map[string]int{}
			for tick := 0; tick < slots; tick++ {
				k.heartbeat(ctx)
				count := map[string]int{}
				for _, a := range client.Actions() {
					count[a.GetVerb()+" "+a.GetResource().Resource+"/"+a.GetSubresource()]++
					if u, ok := a.(k8stesting.UpdateAction); ok && a.GetSubresource() == "status" {
						readyPerNode[u.GetObject().(*v1.Node).Name]++
					}
				}
				client.ClearActions()
				// The informer sees the re-posted nodes before the next tick.
				for t0 := time.Now(); time.Since(t0) < 10*time.Second; time.Sleep(10 * time.Millisecond) {
					o5, _, _ := k.nodes.GetByKey("n005")
					o7, _, _ := k.nodes.GetByKey("n007")
					if ready(o5.(*v1.Node), clock, time.Minute) && ready(o7.(*v1.Node), clock, time.Minute) {
						break
					}
				}
				if got := count["update nodes/status"]; got < nodes/slots/2 || got > 2*nodes/slots {
					t.Errorf("tick %d: %d Ready posts, want about %d", tick, got, nodes/slots)
				}
				want := map[string]int{}
				switch {
				case !tc.leaseTicks[tick]:
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
				clock = clock.Add(heartbeatTick)
			}
			for i := 0; i < nodes; i++ {
				name, want := fmt.Sprintf("n%03d", i), 1
				if (i == 5 || i == 7) && slotOf(name, slots) != 0 {
					want = 2 // at once, and in its slot
				}
				if readyPerNode[name] != want {
					t.Errorf("%s: Ready posted %d times in one period, want %d", name, readyPerNode[name], want)
				}
			}
		})
	}
}
