// Package plugins registers our plugins, for the binary and the simulator.
package plugins

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
	frameworkruntime "k8s.io/kubernetes/pkg/scheduler/framework/runtime"

	_ "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme" // our args in the scheduler's scheme
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/fitfast"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpudra"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpufit"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpupreemption"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/gpuscore"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/internal/shared"
	"github.com/gpu-scheduler/gpu-scheduler/pkg/plugins/leastrequested"
)

// Registry holds our out-of-tree plugins.
func Registry() frameworkruntime.Registry {
	return frameworkruntime.Registry{
		fitfast.Name:        fitfast.New,
		gpufit.Name:         gpufit.New,
		gpudra.Name:         gpudra.New,
		gpupreemption.Name:  gpupreemption.New,
		gpuscore.Name:       gpuscore.New,
		leastrequested.Name: leastrequested.New,
	}
}

// Options registers our plugins with the scheduler command.
func Options() []app.Option {
	var opts []app.Option
	for name, factory := range Registry() {
		opts = append(opts, app.WithPlugin(name, factory))
	}
	return opts
}

// SetNoLeaderElection tells the plugins that this process runs without
// leader election: it leads from the start (its metrics and reasons are
// published before any pod is scheduled).
func SetNoLeaderElection() { shared.SetNoLeaderElection() }

var featureDisabled = metrics.NewGaugeVec(&metrics.GaugeOpts{
	Subsystem: "gpu_scheduler", Name: "feature_disabled", StabilityLevel: metrics.ALPHA,
	Help: "1 for a feature gate gpu-scheduler turned off at startup because the API server cannot serve it (reason: why).",
}, []string{"feature", "reason"})

var featureOnce sync.Once

// FeatureDisabled records a feature gate turned off at startup because the
// API server cannot serve it.
func FeatureDisabled(feature, reason string) {
	featureOnce.Do(func() { legacyregistry.MustRegister(featureDisabled) })
	featureDisabled.WithLabelValues(feature, reason).Set(1)
}
