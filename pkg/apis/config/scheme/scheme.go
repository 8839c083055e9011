// Package scheme registers our plugin args with the scheduler's config
// scheme. Import it (the plugins do) before a config is loaded.
package scheme

import (
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config"
	configv1 "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/v1"
)

// Scheme is the scheduler's own scheme, which decodes config files.
var Scheme = kubeschedulerscheme.Scheme

func init() {
	AddToScheme(Scheme)
}

// AddToScheme registers the internal and v1 args.
func AddToScheme(s *runtime.Scheme) {
	utilruntime.Must(config.AddToScheme(s))
	utilruntime.Must(configv1.AddToScheme(s))
}

// DefaultGPUFitArgs returns the defaulted internal args, for plugins
// constructed without a config (tests, the simulator).
func DefaultGPUFitArgs() *config.GPUFitArgs {
	in := &configv1.GPUFitArgs{}
	configv1.SetDefaults_GPUFitArgs(in)
	out := &config.GPUFitArgs{}
	configv1.Convert_v1_GPUFitArgs_To_config_GPUFitArgs(in, out)
	return out
}

// DefaultGPUScoreArgs returns the defaulted internal args.
func DefaultGPUScoreArgs() *config.GPUScoreArgs {
	in := &configv1.GPUScoreArgs{}
	configv1.SetDefaults_GPUScoreArgs(in)
	out := &config.GPUScoreArgs{}
	configv1.Convert_v1_GPUScoreArgs_To_config_GPUScoreArgs(in, out)
	return out
}

// DefaultGPUPreemptionArgs returns the defaulted internal args.
func DefaultGPUPreemptionArgs() *config.GPUPreemptionArgs {
	in := &configv1.GPUPreemptionArgs{}
	configv1.SetDefaults_GPUPreemptionArgs(in)
	out := &config.GPUPreemptionArgs{}
	configv1.Convert_v1_GPUPreemptionArgs_To_config_GPUPreemptionArgs(in, out)
	return out
}

// DefaultLeastRequestedArgs returns the defaulted internal args.
func DefaultLeastRequestedArgs() *config.LeastRequestedArgs {
	in := &configv1.LeastRequestedArgs{}
	configv1.SetDefaults_LeastRequestedArgs(in)
	out := &config.LeastRequestedArgs{}
	for _, r := range in.Resources {
		out.Resources = append(out.Resources, config.ResourceWeight{Name: r.Name, Weight: r.Weight})
	}
	return out
}
