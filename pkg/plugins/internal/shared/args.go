package shared

import (
	"errors"
	"fmt"
	"slices"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	configv1 "k8s.io/kube-scheduler/config/v1"
	schedscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	kjson "sigs.k8s.io/json"
)

// InTreeArgs reads the args of an in-tree plugin that runs under one of our
// names: the internal type as is, none (the defaults), or a pluginConfig
// entry's raw JSON, which the scheduler's loader leaves undecoded for a
// name it does not know. The JSON is read strictly, as the loader reads
// in-tree args (an unknown, miscased or repeated field is an error, not a
// default), into v1args, whose kind must be one of kinds when given; it is
// then defaulted and converted into out, as upstream's.
func InTreeArgs[T runtime.Object](obj runtime.Object, v1args runtime.Object, out T, kinds ...string) (T, error) {
	if a, ok := obj.(T); ok {
		return a, nil
	}
	var zero T
	if u, ok := obj.(*runtime.Unknown); ok && len(u.Raw) > 0 {
		strict, err := kjson.UnmarshalStrict(u.Raw, v1args, kjson.DisallowDuplicateFields, kjson.DisallowUnknownFields)
		if err != nil {
			return zero, fmt.Errorf("args: %w", err)
		}
		if len(strict) > 0 {
			return zero, fmt.Errorf("args: %w", errors.Join(strict...))
		}
		gvk := v1args.GetObjectKind().GroupVersionKind()
		if gvk.Kind != "" && !slices.Contains(kinds, gvk.Kind) {
			return zero, fmt.Errorf("args: kind %q, want %s", gvk.Kind, kinds[0])
		}
		if gv := gvk.GroupVersion(); gv != (schema.GroupVersion{}) && gv != configv1.SchemeGroupVersion {
			return zero, fmt.Errorf("args: apiVersion %q, want %s", gv, configv1.SchemeGroupVersion)
		}
	} else if obj != nil {
		return zero, fmt.Errorf("got args of type %T, want %s", obj, kinds[0])
	}
	schedscheme.Scheme.Default(v1args)
	if err := schedscheme.Scheme.Convert(v1args, out, nil); err != nil {
		return zero, err
	}
	return out, nil
}
