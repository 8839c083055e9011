package requeue

import (
	"context"
	"flag"
	"fmt"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu/gputest"
)

var (
	passNodes   = flag.Int("pass-nodes", 5000, "nodes for BenchmarkResyncPass")
	passPending = flag.Int("pass-pending", 50000, "pending pods for BenchmarkResyncPass")
)

// BenchmarkResyncPass is one full pass of the reconciler over every pending
// pod (ns/op is the pass), with two workers, as in a resync: 5,000 nodes of
// 8 GPUs, nearly full (no device wholly free, at most 600 milli free on
// one), and 50,000 pending pods that fit nowhere: half ask for a whole GPU,
// 30% for an 800-milli share, and 20% for a 500-milli share on a zone no
// node is in (a device has room; only visiting the nodes shows that none
// qualifies). "distinct" gives each of the last group its own zone, so that
// no two pods share a verdict (the worst case). The reasons are not written
// (their writer is separate and rate-limited).
func BenchmarkResyncPass(b *testing.B) {
	for _, distinct := range []bool{false, true} {
		name := "replicas"
		if distinct {
			name = "distinct"
		}
		b.Run(name, func(b *testing.B) {
			r, podInf, _ := passFixture(b)
			var keys []string
			for i := 0; i < *passPending; i++ {
				name := fmt.Sprintf("pending-%06d", i)
				var p *v1.Pod
				switch x := i % 10; {
				case x < 5:
					p = pendingPod(name, nil, 1)
				case x < 8:
					p = pendingPod(name, map[string]string{gpu.AnnotationMilli: "800"}, 0)
				default:
					p = pendingPod(name, map[string]string{gpu.AnnotationMilli: "500"}, 0)
					zone := fmt.Sprintf("z%d", i%7)
					if distinct {
						zone = fmt.Sprintf("z%d", i)
					}
					p.Spec.NodeSelector = map[string]string{"zone": zone}
				}
				p.Spec.Containers[0].Resources.Requests[v1.ResourceMemory] = resource.MustParse("1Gi")
				podInf.GetStore().Add(p)
				keys = append(keys, "ns/"+name)
			}
			ctx := klog.NewContext(context.Background(), klog.Background())
			pass := func() {
				r.recomputeAll() // as a resync does
				work := make(chan string, 1024)
				var wg sync.WaitGroup
				for w := 0; w < 2; w++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for k := range work {
							if err := r.reconcile(ctx, k); err != nil {
								b.Error(err)
							}
						}
					}()
				}
				for _, k := range keys {
					work <- k
				}
				close(work)
				wg.Wait()
			}
			pass() // warm: parse caches, first view
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				pass()
			}
			b.StopTimer()
			if n := len(r.activator.(*gputest.Activator).Activated()); n != 0 {
				b.Fatalf("%d pods activated; none fits", n)
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(b.N)/float64(len(keys)), "us/pod")
		})
	}
}

// passFixture is the reconciler over -pass-nodes nodes of 8 GPUs, nearly
// full (no device wholly free, at most 600 milli free on one), with three
// bound pods each.
func passFixture(b *testing.B) (*Reconciler, cache.SharedIndexInformer, cache.SharedIndexInformer) {
	client := fake.NewClientset()
	f := informers.NewSharedInformerFactory(client, 0)
	podInf, nodeInf := f.Core().V1().Pods().Informer(), f.Core().V1().Nodes().Informer()
	podInf.AddIndexers(cache.Indexers{"node": func(obj interface{}) ([]string, error) {
		return []string{obj.(*v1.Pod).Spec.NodeName}, nil
	}})
	st := &state{tracker: gpu.NewTracker(gpu.DefaultNodeOptions), pods: podInf.GetIndexer()}
	act := &gputest.Activator{}
	r, err := New(Config{SchedulerName: gpu.SchedulerName, Workers: 2, ResyncPeriod: time.Minute, BackoffBase: time.Millisecond,
		BackoffMax: time.Second, Explain: false}, st, act, client, podInf, nodeInf, gpu.DefaultRequestOptions, func() bool { return true })
	if err != nil {
		b.Fatal(err)
	}
	models := []string{"A100", "T4", "L4"}
	for i := 0; i < *passNodes; i++ {
		n := fmt.Sprintf("node-%05d", i)
		nodeInf.GetStore().Add(gpuNode(n, 8, models[i%3]))
		podInf.GetStore().Add(boundPod(n+"-whole", n, n+":0=1000,1=1000,2=1000,3=1000,4=1000,5=1000"))
		podInf.GetStore().Add(boundPod(n+"-s1", n, n+":6=700"))
		podInf.GetStore().Add(boundPod(n+"-s2", n, n+":7=400"))
	}
	return r, podInf, nodeInf
}

// BenchmarkViewRebuild is one rebuild of the reconciler's view (ns/op) at
// -pass-nodes nodes, after 5 s of the churn of make bench-churn at 5,000
// nodes: a tenth of the nodes had a pod replaced (100 pod creations and
// deletions per second) and 8% had a label rewritten (GPU Feature
// Discovery's timestamp, 83 nodes per second). "every-node" computes every
// node's state again, as before the bases were kept (the baseline);
// "changed-only" reports its time as a ratio to it (x-every-node).
func BenchmarkViewRebuild(b *testing.B) {
	r, podInf, nodeInf := passFixture(b)
	nodes := *passNodes
	churn := func(round int) {
		for i := round % 10; i < nodes; i += 10 {
			n := fmt.Sprintf("node-%05d", i)
			podInf.GetStore().Update(boundPod(n+"-s2", n, n+":7=400"))
		}
		for i := round % 12; i < nodes; i += 12 {
			o, _, _ := nodeInf.GetStore().GetByKey(fmt.Sprintf("node-%05d", i))
			n := o.(*v1.Node).DeepCopy()
			n.Labels["nvidia.com/gfd.timestamp"] = fmt.Sprint(round)
			nodeInf.GetStore().Update(n)
		}
	}
	var every float64
	for _, mode := range []string{"every-node", "changed-only"} {
		b.Run(mode, func(b *testing.B) {
			r.viewNow() // warm: parse caches, first bases
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				churn(i)
				if mode == "every-node" {
					r.bases = nil
				}
				r.invalidate()
				b.StartTimer()
				r.viewNow()
			}
			b.StopTimer()
			ns := float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if mode == "every-node" {
				every = ns
			} else if every > 0 {
				b.ReportMetric(ns/every, "x-every-node")
			}
		})
	}
}
