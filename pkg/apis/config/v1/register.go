package v1

import (
	"k8s.io/apimachinery/pkg/runtime"
	schedv1 "k8s.io/kube-scheduler/config/v1"
)

// SchemeGroupVersion is kubescheduler.config.k8s.io/v1.
var SchemeGroupVersion = schedv1.SchemeGroupVersion

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(SchemeGroupVersion, &GPUFitArgs{}, &GPUScoreArgs{}, &LeastRequestedArgs{}, &GPUPreemptionArgs{})
	return nil
}

func addDefaultingFuncs(scheme *runtime.Scheme) error {
	scheme.AddTypeDefaultingFunc(&GPUFitArgs{}, func(obj interface{}) { SetDefaults_GPUFitArgs(obj.(*GPUFitArgs)) })
	scheme.AddTypeDefaultingFunc(&GPUScoreArgs{}, func(obj interface{}) { SetDefaults_GPUScoreArgs(obj.(*GPUScoreArgs)) })
	scheme.AddTypeDefaultingFunc(&LeastRequestedArgs{}, func(obj interface{}) { SetDefaults_LeastRequestedArgs(obj.(*LeastRequestedArgs)) })
	scheme.AddTypeDefaultingFunc(&GPUPreemptionArgs{}, func(obj interface{}) { SetDefaults_GPUPreemptionArgs(obj.(*GPUPreemptionArgs)) })
	return nil
}

var localSchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes, addDefaultingFuncs, addConversionFuncs)

// AddToScheme registers the v1 args with defaults and conversions.
var AddToScheme = localSchemeBuilder.AddToScheme

func init() {
	// The scheduler builds its plugin-args conversion scheme from its own
	// v1 SchemeBuilder, so our types must be in it before that happens.
	schedv1.SchemeBuilder.Register(addKnownTypes, addDefaultingFuncs, addConversionFuncs)
}
