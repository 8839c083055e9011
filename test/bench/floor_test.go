package bench

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
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
// scheduler's pod and node caches, as kube-scheduler builds them, with no
// handlers; its CPU over the churn-only window is reported beside the
// scheduler's.
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

// floorProc is a running floor process.
type floorProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

// startFloor runs the floor process and waits until its caches are synced.
func startFloor(ctx context.Context) (*floorProc, error) {
	kc, err := cluster.CP.WriteKubeconfig(localcp.UserKubeScheduler, filepath.Join(cluster.Dir, "floor.kubeconfig"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), floorEnv+"="+kc)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &floorProc{cmd: cmd, done: make(chan struct{})}
	synced := make(chan bool, 1)
	go func() {
		s := bufio.NewScanner(out)
		ok := false
		for s.Scan() {
			if s.Text() == "synced" && !ok {
				ok = true
				synced <- true
			}
		}
		if !ok {
			synced <- false
		}
		cmd.Wait()
		close(p.done)
	}()
	select {
	case ok := <-synced:
		if ok {
			return p, nil
		}
		err = errors.New("the floor process ended before its caches synced")
	case <-time.After(5 * time.Minute):
		err = errors.New("the floor process's caches did not sync in 5 minutes")
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.stop()
	return nil, err
}

func (p *floorProc) pid() int { return p.cmd.Process.Pid }

// stop ends the process (killed if SIGTERM does not end it in 10 s).
func (p *floorProc) stop() {
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
}
