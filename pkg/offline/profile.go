// Package offline runs a scheduler profile without an apiserver: it loads the
// configuration as the binary does, builds the framework with the same wiring
// as the scheduler, keeps a snapshot of nodes in a fixed order, and drives
// scheduling cycles the way the scheduler's schedulePod does. The decisions
// are made by the production plugins; the simulator and the framework-level
// tests run on it.
package offline

import (
	"fmt"
	"os"

	"k8s.io/kubernetes/pkg/scheduler/apis/config"
	kubeschedulerscheme "k8s.io/kubernetes/pkg/scheduler/apis/config/scheme"
	"k8s.io/kubernetes/pkg/scheduler/apis/config/validation"

	_ "github.com/gpu-scheduler/gpu-scheduler/pkg/apis/config/scheme" // our args
)

// LoadConfig decodes and defaults a KubeSchedulerConfiguration, with typed
// plugin args, and validates it as kube-scheduler does at startup.
func LoadConfig(data []byte) (*config.KubeSchedulerConfiguration, error) {
	obj, gvk, err := kubeschedulerscheme.Codecs.UniversalDecoder().Decode(data, nil, nil)
	if err != nil {
		return nil, err
	}
	cfg, ok := obj.(*config.KubeSchedulerConfiguration)
	if !ok {
		return nil, fmt.Errorf("not a KubeSchedulerConfiguration: %s", gvk)
	}
	cfg.TypeMeta.APIVersion = gvk.GroupVersion().String()
	if err := validation.ValidateKubeSchedulerConfiguration(cfg); err != nil {
		return nil, err
	}
	return cfg, nil
}

// LoadConfigFile reads a configuration file.
func LoadConfigFile(path string) (*config.KubeSchedulerConfiguration, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return LoadConfig(data)
}

// Profile returns the named profile.
func Profile(cfg *config.KubeSchedulerConfiguration, name string) (*config.KubeSchedulerProfile, error) {
	for i := range cfg.Profiles {
		if cfg.Profiles[i].SchedulerName == name {
			return &cfg.Profiles[i], nil
		}
	}
	return nil, fmt.Errorf("no profile %q in the configuration", name)
}
