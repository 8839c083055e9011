package requeue

import (
	"sync"
	"sync/atomic"

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
)

var registerOnce sync.Once

func registerMetrics() {
	registerOnce.Do(func() {
		legacyregistry.MustRegister(reconciles, activations, queueDepth, pendingPods, activationLatency,
			reasonWrites, passSeconds, staleReservations, clusterIdle, clusterFrag, clusterFragRatio, placeable, taskShare, pendingByClass, pendingAge,
			gangPending, gangPendingAge)
		legacyregistry.CustomMustRegister(nodeMetrics)
	})
}

// Per node and GPU model, as of the last resync. A collector serves them
// from the rows of the last resync at each scrape: a gauge per node and
// series held 7.6 MB at 5,000 nodes (15,000 children with their label
// pairs) and was dropped and built again at every resync.
var (
	allocatedDesc = metrics.NewDesc("gpu_scheduler_allocated_milli",
		"Milli-GPU allocated per node and GPU model (assignments and reservations).",
		[]string{"node", "model"}, nil, metrics.ALPHA, "")
	capacityDesc = metrics.NewDesc("gpu_scheduler_capacity_milli",
		"Schedulable milli-GPU per node and GPU model.",
		[]string{"node", "model"}, nil, metrics.ALPHA, "")
	fragDesc = metrics.NewDesc("gpu_scheduler_fragmentation_milli",
		"Idle milli-GPU of a node that the typical pods of the target workload could not use (expected, by their shares), per node and GPU model.",
		[]string{"node", "model"}, nil, metrics.ALPHA, "")
	unhealthyDesc = metrics.NewDesc("gpu_scheduler_unhealthy_gpus",
		"Installed GPUs that are not allocatable (capacity minus allocatable), per node and GPU model.",
		[]string{"node", "model"}, nil, metrics.ALPHA, "")
	nodeMetrics = &nodeCollector{}
)

// nodeRow is one node's figures.
type nodeRow struct {
	node, model          string
	unhealthy            int32
	allocated, capacity  int64
	frag                 float64
	hasFrag, hasCapacity bool
}

type nodeCollector struct {
	metrics.BaseStableCollector
	rows atomic.Pointer[[]nodeRow]
}

// set publishes the rows of a resync (nil: none, as on a standby).
func (c *nodeCollector) set(rows []nodeRow) {
	if rows == nil {
		c.rows.Store(nil)
		return
	}
	c.rows.Store(&rows)
}

func (c *nodeCollector) DescribeWithStability(ch chan<- *metrics.Desc) {
	ch <- allocatedDesc
	ch <- capacityDesc
	ch <- fragDesc
	ch <- unhealthyDesc
}

func (c *nodeCollector) CollectWithStability(ch chan<- metrics.Metric) {
	p := c.rows.Load()
	if p == nil {
		return
	}
	for _, r := range *p {
		if r.unhealthy > 0 {
			ch <- metrics.NewLazyConstMetric(unhealthyDesc, metrics.GaugeValue, float64(r.unhealthy), r.node, r.model)
		}
		if r.hasCapacity {
			ch <- metrics.NewLazyConstMetric(allocatedDesc, metrics.GaugeValue, float64(r.allocated), r.node, r.model)
			ch <- metrics.NewLazyConstMetric(capacityDesc, metrics.GaugeValue, float64(r.capacity), r.node, r.model)
		}
		if r.hasFrag {
			ch <- metrics.NewLazyConstMetric(fragDesc, metrics.GaugeValue, r.frag, r.node, r.model)
		}
	}
}
