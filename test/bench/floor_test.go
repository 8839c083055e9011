package bench

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	configv1 "k8s.io/kube-scheduler/config/v1"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
	"github.com/gpu-scheduler/gpu-scheduler/test/harness"
)

// The floors of following the churn. With -floor, the churn runs start two
// processes for the churn-only window, and report their CPU and allocation
// beside the scheduler's:
//   - the informer floor, what any scheduler built on client-go's informers
//     pays whatever its plugins: this test binary, run again, keeping only
//     the scheduler's pod and node caches as kube-scheduler builds them,
//     with handlers that do nothing;
//   - the framework floor, what any scheduler built on the Scheduling
//     Framework pays: the vanilla kube-scheduler with no pod to schedule
//     (startFrameworkFloor).
var chFloor = flag.Bool("floor", false, "also measure, under the churn before the stream, a process that keeps only the scheduler's pod and node informers, and the vanilla kube-scheduler with no pod to schedule (churn runs)")

const floorEnv = "GPU_SCHEDULER_BENCH_INFORMER_FLOOR"

// informerFloorMain is the floor process: informers until SIGTERM.
func informerFloorMain(kubeconfig string) error {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// As kube-scheduler talks to the API server.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	f := scheduler.NewInformerFactory(cs, 0, nil)
	none := cache.ResourceEventHandlerFuncs{AddFunc: func(interface{}) {}, UpdateFunc: func(_, _ interface{}) {}, DeleteFunc: func(interface{}) {}}
	if _, err := f.Core().V1().Pods().Informer().AddEventHandler(none); err != nil {
		return err
	}
	if _, err := f.Core().V1().Nodes().Informer().AddEventHandler(none); err != nil {
		return err
	}
	f.Start(ctx.Done())
	for typ, ok := range f.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return fmt.Errorf("%v informer did not sync", typ)
		}
	}
	fmt.Println("synced")
	// What it allocated, for the bench to read (floorAllocated).
	stats := kubeconfig + ".alloc"
	for tick := time.NewTicker(500 * time.Millisecond); ; {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		os.WriteFile(stats+".tmp", []byte(strconv.FormatUint(ms.TotalAlloc, 10)), 0o644)
		os.Rename(stats+".tmp", stats)
		select {
		case <-ctx.Done():
			tick.Stop()
			f.Shutdown()
			return nil
		case <-tick.C:
		}
	}
}

// floorKubeconfig is the floor process's kubeconfig; it writes the bytes
// it allocated beside it.
func floorKubeconfig() string { return filepath.Join(cluster.Dir, "floor.kubeconfig") }

// floorAllocated reads the bytes the floor process allocated since it
// started, as of its last write (every 0.5 s).
func floorAllocated() float64 {
	b, err := os.ReadFile(floorKubeconfig() + ".alloc")
	if err != nil {
		return 0
	}
	v, _ := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return v
}

// startFloor runs the floor process (killed if the bench dies) and waits
// until its caches are synced.
func startFloor(ctx context.Context) (*localcp.Proc, error) {
	kc, err := cluster.CP.WriteKubeconfig(localcp.UserKubeScheduler, floorKubeconfig())
	if err != nil {
		return nil, err
	}
	logPath := filepath.Join(cluster.Dir, "informer-floor.log")
	p, err := localcp.StartProcEnv(ctx, "informer-floor", os.Args[0], nil, []string{floorEnv + "=" + kc}, logPath)
	if err != nil {
		return nil, err
	}
	for t0 := time.Now(); time.Since(t0) < 5*time.Minute && ctx.Err() == nil; time.Sleep(200 * time.Millisecond) {
		if out, _ := os.ReadFile(logPath); bytes.Contains(out, []byte("\nsynced\n")) || bytes.HasPrefix(out, []byte("synced\n")) {
			// Its initial list and the collection after it out of the
			// window, and the API server's share of that list too.
			time.Sleep(10 * time.Second)
			return p, nil
		}
		if p.Exited() {
			return nil, fmt.Errorf("the informer floor process ended before its caches synced: %s", p.Tail(3000))
		}
	}
	p.Stop(10 * time.Second)
	return nil, errors.New("the informer floor process's caches did not sync in 5 minutes")
}

// startFrameworkFloor runs the vanilla kube-scheduler under a scheduler
// name no pod has: it follows the churn as every scheduler built on the
// Scheduling Framework does (its cache of nodes and bound pods, its queue's
// handlers) with nothing to schedule. Its cost above the informer floor is
// upstream's handling of the events; the scheduler under test's cost above
// it is its backlog's and its plugins'.
func startFrameworkFloor(ctx context.Context) (*localcp.Scheduler, error) {
	const name = "framework-floor"
	kc, err := cluster.CP.WriteKubeconfig(localcp.UserKubeScheduler, filepath.Join(cluster.Dir, name+".kubeconfig"))
	if err != nil {
		return nil, err
	}
	s, err := localcp.StartScheduler(ctx, localcp.SchedulerOptions{
		Name: name, Binary: filepath.Join(harness.BinDir(), "kube-scheduler"), Kubeconfig: kc, Dir: cluster.Dir,
		Config: []byte("apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nprofiles:\n- schedulerName: " + name + "\n"),
		Args:   []string{"--v=1"},
		Mutate: func(c *configv1.KubeSchedulerConfiguration) { c.LeaderElection.LeaderElect = ptr.To(false) },
	})
	if err != nil {
		return nil, err
	}
	s.Token = cluster.CP.Token(localcp.UserAdmin)
	if err := s.WaitReady(ctx, 5*time.Minute); err != nil {
		s.Stop(10 * time.Second)
		return nil, fmt.Errorf("the framework floor: %w", err)
	}
	time.Sleep(10 * time.Second) // as the informer floor: its list out of the window
	return s, nil
}
