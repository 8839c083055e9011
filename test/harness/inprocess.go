package harness

import (
	"context"
	"fmt"
	"net/http"

	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/kubernetes/pkg/scheduler"
	"k8s.io/kubernetes/pkg/scheduler/profile"

	ourconfig "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/offline"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins"
)

// InProcess is a scheduler running in the test process, built as
// kube-scheduler builds it (scheduler.New with our out-of-tree registry),
// without leader election or serving.
type InProcess struct {
	Sched  *scheduler.Scheduler
	cancel context.CancelFunc
	done   chan struct{}
}

// InProcessOptions vary an in-process scheduler for a test.
type InProcessOptions struct {
	// ExtraProfiles adds copies of the first profile under these scheduler
	// names (one scheduler, several profiles).
	ExtraProfiles []string
	// WrapTransport wraps the scheduler's client transport (fault injection).
	WrapTransport func(http.RoundTripper) http.RoundTripper
	// FitArgs changes every profile's GPUFit args.
	FitArgs func(*ourconfig.GPUFitArgs)
}

// AccountingOnly is FitArgs for tests of the accounting on nodes without a
// device agent: shares by annotation alone are placed there.
func AccountingOnly(a *ourconfig.GPUFitArgs) { a.AccountingOnlySharing = true }

// StartInProcess runs the configuration's profiles against the cluster.
func StartInProcess(ctx context.Context, cfg *rest.Config, configYAML []byte) (*InProcess, error) {
	return StartInProcessWith(ctx, cfg, configYAML, InProcessOptions{})
}

// StartInProcessWith is StartInProcess with options.
func StartInProcessWith(ctx context.Context, cfg *rest.Config, configYAML []byte, opts InProcessOptions) (*InProcess, error) {
	kcfg, err := offline.LoadConfig(configYAML)
	if err != nil {
		return nil, err
	}
	if opts.FitArgs != nil {
		for i := range kcfg.Profiles {
			for _, pc := range kcfg.Profiles[i].PluginConfig {
				if a, ok := pc.Args.(*ourconfig.GPUFitArgs); ok {
					opts.FitArgs(a)
				}
			}
		}
	}
	// It runs without leader election, beside a deployed scheduler whose
	// lease it must not write.
	for i := range kcfg.Profiles {
		for _, pc := range kcfg.Profiles[i].PluginConfig {
			if a, ok := pc.Args.(*ourconfig.GPUScoreArgs); ok {
				a.TargetWorkload.PublishTo = ""
			}
		}
	}
	for _, name := range opts.ExtraProfiles {
		p := kcfg.Profiles[0].DeepCopy()
		p.SchedulerName = name
		kcfg.Profiles = append(kcfg.Profiles, *p)
	}
	if opts.WrapTransport != nil {
		cfg = rest.CopyConfig(cfg)
		cfg.Wrap(opts.WrapTransport)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	informerFactory := scheduler.NewInformerFactory(client, 0, nil)
	dynInformerFactory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, "", nil)
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	sched, err := scheduler.New(ctx, client, informerFactory, dynInformerFactory, profile.NewRecorderFactory(broadcaster),
		scheduler.WithProfiles(kcfg.Profiles...),
		scheduler.WithFrameworkOutOfTreeRegistry(plugins.Registry()),
		scheduler.WithPodInitialBackoffSeconds(kcfg.PodInitialBackoffSeconds),
		scheduler.WithPodMaxBackoffSeconds(kcfg.PodMaxBackoffSeconds),
		scheduler.WithParallelism(kcfg.Parallelism),
	)
	if err != nil {
		cancel()
		return nil, err
	}
	broadcaster.StartRecordingToSink(ctx.Done())
	informerFactory.Start(ctx.Done())
	dynInformerFactory.Start(ctx.Done())
	for typ, ok := range informerFactory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			cancel()
			return nil, fmt.Errorf("informer %v did not sync", typ)
		}
	}
	if err := sched.WaitForHandlersSync(ctx); err != nil {
		cancel()
		return nil, err
	}
	p := &InProcess{Sched: sched, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		sched.Run(ctx)
	}()
	return p, nil
}

// Stop stops the scheduler and waits for its loop to end.
func (p *InProcess) Stop() {
	p.cancel()
	<-p.done
}
