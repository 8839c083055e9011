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
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/kubernetes/pkg/scheduler"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/localcp"
)

// The floor of following the churn: what any scheduler built on client-go's
// informers pays, whatever its plugins. With -floor, the churn runs start a
// process of their own (this test binary, run again) that keeps only the
// scheduler's pod and node caches, as kube-scheduler builds them, with
// handlers that do nothing; its CPU over the churn-only window is reported
// beside the scheduler's.
var chFloor = flag.Bool("floor", false, "also measure a process that keeps only the scheduler's pod and node informers under the churn (churn runs)")

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
	<-ctx.Done()
	f.Shutdown()
	return nil
}

// startFloor runs the floor process (killed if the bench dies) and waits
// until its caches are synced.
func startFloor(ctx context.Context) (*localcp.Proc, error) {
	kc, err := cluster.CP.WriteKubeconfig(localcp.UserKubeScheduler, filepath.Join(cluster.Dir, "floor.kubeconfig"))
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
