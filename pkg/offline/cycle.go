package offline

import (
	"context"
	"fmt"
	"sort"

	v1 "k8s.io/api/core/v1"
	"k8s.io/klog/v2"
	fwk "k8s.io/kube-scheduler/framework"
	"k8s.io/kubernetes/pkg/scheduler/framework"
)

func klogFrom(ctx context.Context) klog.Logger { return klog.FromContext(ctx) }

// Result is the outcome of one scheduling cycle.
type Result struct {
	// Node is the chosen node, empty if the pod does not fit.
	Node string
	// Err is a *framework.FitError ("0/N nodes are available: ...") when no
	// node fits, or an internal error.
	Err error
	// Rejected holds the Filter status of every node that did not pass.
	Rejected map[string]*fwk.Status
	// Feasible lists the nodes that passed, in cluster order.
	Feasible []string
	// Scores are the weighted per-plugin scores, when there was a choice.
	Scores []fwk.NodePluginScores
	// State is the cycle state, for Commit.
	State fwk.CycleState
}

// Schedule runs one scheduling cycle for the pod, as the scheduler's
// schedulePod: PreFilter, Filter on every node (percentageOfNodesToScore is
// 100), then PreScore and Score if more than one node fits. Ties in the total
// score go to the node listed first, which is what the scheduler's sort does
// when no extender randomises it.
func Schedule(ctx context.Context, f framework.Framework, cluster *Cluster, pod *v1.Pod) Result {
	state := framework.NewCycleState()
	res := Result{State: state, Rejected: map[string]*fwk.Status{}}
	nodes := cluster.Nodes()
	diagnosis := framework.Diagnosis{NodeToStatus: framework.NewDefaultNodeToStatus()}

	preRes, s, unschedulable := f.RunPreFilterPlugins(ctx, state, pod)
	diagnosis.UnschedulablePlugins = unschedulable
	if !s.IsSuccess() {
		if !s.IsRejected() {
			res.Err = statusError("PreFilter", s)
			return res
		}
		diagnosis.NodeToStatus.SetAbsentNodesStatus(s)
		diagnosis.PreFilterMsg = s.Message()
		diagnosis.AddPluginStatus(s)
		res.Err = &framework.FitError{Pod: pod, NumAllNodes: len(nodes), Diagnosis: diagnosis}
		return res
	}
	candidates := nodes
	if !preRes.AllNodes() {
		candidates = nil
		for _, n := range nodes {
			if preRes.NodeNames.Has(n.Node().Name) {
				candidates = append(candidates, n)
			} else {
				st := fwk.NewStatus(fwk.UnschedulableAndUnresolvable, fmt.Sprintf("node(s) didn't satisfy plugin(s) %v", sortedSet(unschedulable)))
				diagnosis.NodeToStatus.Set(n.Node().Name, st)
				res.Rejected[n.Node().Name] = st
			}
		}
	}

	statuses := make([]*fwk.Status, len(candidates))
	if f.HasFilterPlugins() {
		f.Parallelizer().Until(ctx, len(candidates), func(i int) {
			statuses[i] = f.RunFilterPlugins(ctx, state, pod, candidates[i])
		}, "Filter")
	}
	if err := ctx.Err(); err != nil {
		// Until skips the nodes left once the context is done: their nil
		// statuses would read as passes.
		res.Err = err
		return res
	}
	var feasible []fwk.NodeInfo
	for i, st := range statuses {
		name := candidates[i].Node().Name
		switch {
		case st.IsSuccess():
			feasible = append(feasible, candidates[i])
			res.Feasible = append(res.Feasible, name)
		case st.Code() == fwk.Error:
			res.Err = statusError("Filter", st)
			return res
		default:
			diagnosis.NodeToStatus.Set(name, st)
			diagnosis.AddPluginStatus(st)
			res.Rejected[name] = st
		}
	}
	switch len(feasible) {
	case 0:
		res.Err = &framework.FitError{Pod: pod, NumAllNodes: len(nodes), Diagnosis: diagnosis}
		return res
	case 1:
		res.Node = feasible[0].Node().Name
		return res
	}
	if st := f.RunPreScorePlugins(ctx, state, pod, feasible); !st.IsSuccess() {
		res.Err = statusError("PreScore", st)
		return res
	}
	scores, st := f.RunScorePlugins(ctx, state, pod, feasible)
	if !st.IsSuccess() {
		res.Err = statusError("Score", st)
		return res
	}
	if err := ctx.Err(); err != nil {
		res.Err = err // the nodes Score skipped have no name
		return res
	}
	res.Scores = scores
	res.Node = framework.NewSortedScoredNodes(append([]fwk.NodePluginScores(nil), scores...)).Pop().Name
	if res.Node == "" {
		res.Err = fmt.Errorf("pod %s/%s: Score ranked %d nodes and named none", pod.Namespace, pod.Name, len(scores))
	}
	return res
}

// Rejected is a Reserve, Permit or PreBind plugin's refusal of the node
// chosen: the scheduler puts the pod back as unschedulable, with that
// plugin as the one whose events may make room.
type Rejected struct {
	Point  string
	Status *fwk.Status
}

func (r *Rejected) Error() string {
	return fmt.Sprintf("%s: plugin %q rejected the pod: %s", r.Point, r.Status.Plugin(), r.Status.Message())
}

// statusError is the status as an error, never nil: AsError is nil for Wait
// and Skip, which an extension point that does not expect them must still
// report. A rejection is a *Rejected.
func statusError(point string, st *fwk.Status) error {
	if st.IsRejected() {
		return &Rejected{Point: point, Status: st}
	}
	if err := st.AsError(); err != nil {
		return err
	}
	return fmt.Errorf("%s: unexpected status %s (plugin %q): %s", point, st.Code(), st.Plugin(), st.Message())
}

func sortedSet(s interface{ UnsortedList() []string }) []string {
	l := s.UnsortedList()
	sort.Strings(l)
	return l
}

// Commit runs Reserve, Permit, PreBind and Bind for a scheduled pod (the
// bind plugins talk to the framework's client, possibly a fake), and binds
// it in the cluster with whatever they wrote. On failure it runs Unreserve,
// as the scheduler does. bound is the pod as it now sits on the node.
func Commit(ctx context.Context, f framework.Framework, cluster *Cluster, pod *v1.Pod, res Result, prebound func(*v1.Pod) *v1.Pod) (*v1.Pod, error) {
	assumed := pod.DeepCopy()
	assumed.Spec.NodeName = res.Node
	state := res.State
	if st := f.RunReservePluginsReserve(ctx, state, assumed, res.Node); !st.IsSuccess() {
		f.RunReservePluginsUnreserve(ctx, state, assumed, res.Node)
		return nil, statusError("Reserve", st)
	}
	if _, st := f.RunPermitPlugins(ctx, state, assumed, res.Node); !st.IsSuccess() {
		f.RunReservePluginsUnreserve(ctx, state, assumed, res.Node)
		return nil, statusError("Permit", st)
	}
	if st := f.RunPreBindPreFlights(ctx, state, assumed, res.Node); st.Code() == fwk.Error {
		f.RunReservePluginsUnreserve(ctx, state, assumed, res.Node)
		return nil, statusError("PreBindPreFlight", st)
	}
	if st := f.RunPreBindPlugins(ctx, state, assumed, res.Node); !st.IsSuccess() {
		f.RunReservePluginsUnreserve(ctx, state, assumed, res.Node)
		return nil, statusError("PreBind", st)
	}
	if st := f.RunBindPlugins(ctx, state, assumed, res.Node); !st.IsSuccess() && !st.IsSkip() {
		f.RunReservePluginsUnreserve(ctx, state, assumed, res.Node)
		return nil, statusError("Bind", st)
	}
	bound := assumed
	if prebound != nil {
		// What PreBind wrote to the API (annotations), as the informer would
		// deliver it.
		bound = prebound(assumed)
		bound.Spec.NodeName = res.Node
	}
	if err := cluster.Bind(bound); err != nil {
		return nil, err
	}
	return bound, nil
}
