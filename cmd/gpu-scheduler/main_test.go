package main

import (
	"errors"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fakediscovery "k8s.io/client-go/discovery/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/component-base/featuregate"
	"k8s.io/kubernetes/pkg/features"
)

// Which gates are turned off, as each minor's API server serves the
// optional APIs (the e2e suite checks the same against the real ones).
func TestGatesToTurnOff(t *testing.T) {
	list := func(gv string, rs ...string) *metav1.APIResourceList {
		l := &metav1.APIResourceList{GroupVersion: gv}
		for _, r := range rs {
			l.APIResources = append(l.APIResources, metav1.APIResource{Name: r})
		}
		return l
	}
	v135 := []*metav1.APIResourceList{list("resource.k8s.io/v1", "resourceclaims", "resourceslices", "deviceclasses")}
	v136 := append(v135, list("scheduling.k8s.io/v1alpha2", "workloads", "podgroups"), list("resource.k8s.io/v1beta2", "devicetaintrules"))
	v137 := []*metav1.APIResourceList{list("resource.k8s.io/v1", "resourceclaims", "resourceslices", "deviceclasses", "devicetaintrules"),
		list("scheduling.k8s.io/v1beta1", "podgroups")}
	defaults := map[featuregate.Feature]bool{features.DRADeviceTaintRules: true}
	gangs := map[featuregate.Feature]bool{features.DRADeviceTaintRules: true, features.GenericWorkload: true, features.CompositePodGroup: true}
	for name, tc := range map[string]struct {
		served []*metav1.APIResourceList
		on     map[featuregate.Feature]bool
		want   []featuregate.Feature
	}{
		"1.35 defaults":   {v135, defaults, []featuregate.Feature{features.DRADeviceTaintRules}},
		"1.36 defaults":   {v136, defaults, []featuregate.Feature{features.DRADeviceTaintRules}},
		"1.37 defaults":   {v137, defaults, nil},
		"1.35 with gangs": {v135, gangs, []featuregate.Feature{features.GenericWorkload, features.DRADeviceTaintRules}},
		"1.36 with gangs": {v136, gangs, []featuregate.Feature{features.GenericWorkload, features.DRADeviceTaintRules}},
		"1.37 with gangs": {v137, gangs, []featuregate.Feature{features.CompositePodGroup}},
		"1.37, gates off": {v137, map[featuregate.Feature]bool{}, nil},
		"1.35, gates off": {v135, map[featuregate.Feature]bool{}, nil},
	} {
		t.Run(name, func(t *testing.T) {
			dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{Resources: tc.served}}
			off, err := gatesToTurnOff(dc, func(g featuregate.Feature) bool { return tc.on[g] })
			if err != nil {
				t.Fatal(err)
			}
			var got []featuregate.Feature
			for _, o := range off {
				got = append(got, o.gate)
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("turned off %v, want %v", got, tc.want)
			}
		})
	}
	// A server that does not answer decides nothing.
	dc := &fakediscovery.FakeDiscovery{Fake: &clienttesting.Fake{}}
	dc.AddReactor("get", "resource", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, errors.New("connection refused")
	})
	if off, err := gatesToTurnOff(dc, func(featuregate.Feature) bool { return true }); err == nil {
		t.Errorf("an unanswered discovery turned off %v", off)
	}
}
