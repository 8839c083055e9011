package requeue

import (
	"sync"

	"k8s.io/component-base/metrics"
	"k8s.io/component-base/metrics/legacyregistry"
)

// Metrics are served on the scheduler's /metrics.
var (
	reconciles = metrics.NewCounterVec(&metrics.CounterOpts{
		Subsystem: "gpu_scheduler", Name: "requeue_reconciles_total", StabilityLevel: metrics.ALPHA,
		Help: "Reconciles of pending GPU pods, by result: activated, pending, explained, skipped, error.",
	}, []string{"result"})
	activations = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "gpu_scheduler", Name: "requeue_activations_total", StabilityLevel: metrics.ALPHA,
		Help: "Pending pods moved back to the active queue because a node could now take them.",
	})
	queueDepth = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "requeue_queue_depth", StabilityLevel: metrics.ALPHA,
		Help: "Keys waiting in the requeue reconciler's work queue.",
	})
	pendingPods = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "requeue_pending_pods", StabilityLevel: metrics.ALPHA,
		Help: "Unschedulable pods of this scheduler, as of the last resync.",
	})
	activationLatency = metrics.NewHistogram(&metrics.HistogramOpts{
		Subsystem: "gpu_scheduler", Name: "requeue_unschedulable_to_activation_seconds", StabilityLevel: metrics.ALPHA,
		Help:    "Time from a pod being marked unschedulable to its activation by the reconciler.",
		Buckets: metrics.ExponentialBuckets(0.001, 2, 22),
	})
	passSeconds = metrics.NewHistogramVec(&metrics.HistogramOpts{
		Subsystem: "gpu_scheduler", Name: "requeue_pass_duration_seconds", StabilityLevel: metrics.ALPHA,
		Help:    "Time for one pass of the reconciler over every pending pod, from its start until the workers are through, by trigger (event, resync).",
		Buckets: metrics.ExponentialBuckets(0.001, 2, 18),
	}, []string{"trigger"})
	reasonWrites = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "gpu_scheduler", Name: "pending_reason_writes_total", StabilityLevel: metrics.ALPHA,
		Help: "Writes of the gpu-scheduler.io/PendingReason pod condition (only when it changes).",
	})
	staleReservations = metrics.NewCounter(&metrics.CounterOpts{
		Subsystem: "gpu_scheduler", Name: "stale_reservations_dropped_total", StabilityLevel: metrics.ALPHA,
		Help: "In-flight reservations dropped because their pod is gone or carries its assignment.",
	})
	allocatedMilli = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "allocated_milli", StabilityLevel: metrics.ALPHA,
		Help: "Milli-GPU allocated per node and GPU model (assignments and reservations).",
	}, []string{"node", "model"})
	capacityMilli = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "capacity_milli", StabilityLevel: metrics.ALPHA,
		Help: "Schedulable milli-GPU per node and GPU model.",
	}, []string{"node", "model"})
	fragMilli = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "fragmentation_milli", StabilityLevel: metrics.ALPHA,
		Help: "Idle milli-GPU of a node that the typical pods of the target workload could not use (expected, by their shares), per node and GPU model.",
	}, []string{"node", "model"})
	clusterIdle = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "cluster_idle_milli", StabilityLevel: metrics.ALPHA,
		Help: "Idle milli-GPU of the cluster's usable GPUs.",
	})
	clusterFrag = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "cluster_fragmentation_milli", StabilityLevel: metrics.ALPHA,
		Help: "Idle milli-GPU of the cluster that the typical pods of the target workload could not use.",
	})
	clusterFragRatio = metrics.NewGauge(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "cluster_fragmentation_ratio", StabilityLevel: metrics.ALPHA,
		Help: "cluster_fragmentation_milli / cluster_idle_milli (0 when nothing is idle).",
	})
	placeable = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "placeable_pods", StabilityLevel: metrics.ALPHA,
		Help: "How many more pods of a typical kind (the target workload's most common, at most 8) the nodes could take, each node alone.",
	}, []string{"kind"})
	taskShare = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "target_workload_share_ratio", StabilityLevel: metrics.ALPHA,
		Help: "The share of a typical kind of pod in the target workload fragmentation is measured against.",
	}, []string{"kind"})
	pendingByClass = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "pending_gpu_pods", StabilityLevel: metrics.ALPHA,
		Help: "Pending GPU pods by why they wait: fragmented (as much GPU idle on the models they allow as they ask, not where they fit), gpu_capacity (less idle than that), gpu_unsuitable (no GPU they could ever use), other (CPU, memory, taints, affinity, cordons), invalid_request; as of the last resync.",
	}, []string{"reason"})
	pendingAge = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "pending_gpu_pod_max_age_seconds", StabilityLevel: metrics.ALPHA,
		Help: "How long the longest-waiting pending GPU pod of each reason has been unschedulable (0 when none), as of the last resync.",
	}, []string{"reason"})
	gangPending = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "gang_pending_pods", StabilityLevel: metrics.ALPHA,
		Help: "Unbound members of pod groups (spec.schedulingGroup) of a profile, as of the last resync.",
	}, []string{"profile"})
	gangPendingAge = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "gang_pending_max_age_seconds", StabilityLevel: metrics.ALPHA,
		Help: "How long the oldest unbound member of a pod group of a profile has existed (0 when none), as of the last resync: a gang waits for all its members, at PreEnqueue or Permit, without a pending condition of its own.",
	}, []string{"profile"})
	unhealthyGPUs = metrics.NewGaugeVec(&metrics.GaugeOpts{
		Subsystem: "gpu_scheduler", Name: "unhealthy_gpus", StabilityLevel: metrics.ALPHA,
		Help: "Installed GPUs that are not allocatable (capacity minus allocatable), per node and GPU model.",
	}, []string{"node", "model"})
)

var registerOnce sync.Once

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(reconciles, activations, queueDepth, pendingPods, activationLatency,
			reasonWrites, passSeconds, staleReservations, allocatedMilli, capacityMilli, unhealthyGPUs,
			fragMilli, clusterIdle, clusterFrag, clusterFragRatio, placeable, taskShare, pendingByClass, pendingAge,
			gangPending, gangPendingAge)
	})
}
