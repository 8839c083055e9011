package kubectlgpu

import (
	"context"
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/gpu-scheduler/gpu-scheduler/manifests"
)

// Where the profile is read from: the default ConfigMap (absent: the
// shipped configuration), another release's (--config-map, which must
// exist), and never silently the shipped one when the deployed one cannot
// be read.
func TestConfigSource(t *testing.T) {
	cm := func(ns, name, data string) *v1.ConfigMap {
		return &v1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}, Data: map[string]string{"scheduler-config.yaml": data}}
	}
	for _, tc := range []struct {
		name      string
		objs      []runtime.Object
		configMap string
		forbidden bool
		want      string // the configuration's text, or the error's
		wantErr   bool
	}{
		{name: "default absent", want: string(manifests.SchedulerConfig)},
		{name: "default present", objs: []runtime.Object{cm("kube-system", "gpu-scheduler-config", "deployed")}, want: "deployed"},
		{name: "another release", objs: []runtime.Object{cm("kube-system", "gpu-scheduler-config", "default"), cm("gpu", "team-a-gpu-scheduler-config", "team-a")},
			configMap: "gpu/team-a-gpu-scheduler-config", want: "team-a"},
		{name: "another release absent", configMap: "gpu/x-config", want: "not found", wantErr: true},
		{name: "forbidden", forbidden: true, want: "--config", wantErr: true},
		{name: "malformed", configMap: "x", want: "namespace/name", wantErr: true},
		{name: "empty", objs: []runtime.Object{cm("kube-system", "gpu-scheduler-config", "")}, want: "no scheduler-config.yaml", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(tc.objs...)
			if tc.forbidden {
				client.PrependReactor("get", "configmaps", func(clienttesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "configmaps"}, "gpu-scheduler-config", nil)
				})
			}
			o := &Options{Client: client, ConfigMap: tc.configMap}
			data, _, err := o.config(context.Background())
			switch {
			case tc.wantErr && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Errorf("err %v, want one saying %q", err, tc.want)
			case !tc.wantErr && (err != nil || string(data) != tc.want):
				t.Errorf("got %.40q, %v; want %.40q", data, err, tc.want)
			}
		})
	}
}
