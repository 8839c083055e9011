package config

import (
	"k8s.io/apimachinery/pkg/runtime"
	schedconfig "k8s.io/kubernetes/pkg/scheduler/apis/config"
)

// SchemeGroupVersion is the scheduler's internal config version; our args
// join it so that the scheduler converts them like its own.
var SchemeGroupVersion = schedconfig.SchemeGroupVersion

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &GPUFitArgs{}, &GPUScoreArgs{}, &LeastRequestedArgs{}, &GPUPreemptionArgs{})
	return nil
}

// AddToScheme registers the internal types. It is also added to the
// scheduler's internal SchemeBuilder, which builds the scheme the scheduler
// uses to convert plugin args.
var (
	localSchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	AddToScheme        = localSchemeBuilder.AddToScheme
)

func init() {
	schedconfig.SchemeBuilder.Register(addKnownTypes)
}
