package gpuscore

import "github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"

// ScoringOf is the ranking the plugin built from its args.
func ScoringOf(pl *GPUScore) gpu.Scoring { return pl.scoring }
