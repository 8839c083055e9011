package gpu

import (
	"math/bits"
	"slices"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// nomination is the devices a preemption freed for its preemptor on a node.
type nomination struct {
	node   string
	choice Choice
}

// Nominate records the devices a preemptor is to get on the node its
// preemption nominated: until it is bound they are held for it in every
// other pod's filters, whether its victims are still there or gone.
func (t *Tracker) Nominate(uid types.UID, node string, c Choice) {
	n := nomination{node: node, choice: c}
	old, had := t.nominated.Swap(uid, n)
	if had && old.(nomination) == n {
		return
	}
	if had {
		t.touch(old.(nomination).node)
	}
	t.touch(node)
}

// Denominate forgets a nomination (the pod is bound, or gone).
func (t *Tracker) Denominate(uid types.UID) {
	if old, had := t.nominated.LoadAndDelete(uid); had {
		t.touch(old.(nomination).node)
	}
}

// touch retires the node's cached states: a nominee's hold is read when a
// state is computed, and a hold that changed must not be served from a
// state computed before.
func (t *Tracker) touch(node string) {
	if s := t.slot(node, false); s != nil {
		s.mu.Lock()
		s.bump()
		s.mu.Unlock()
	}
}

// Nomination returns a nominated pod's node and the devices held for it
// there.
func (t *Tracker) Nomination(uid types.UID) (string, Choice, bool) {
	v, ok := t.nominated.Load(uid)
	if !ok {
		return "", Choice{}, false
	}
	n := v.(nomination)
	return n.node, n.choice, true
}

// Nominated returns the devices held for a nominated pod on node.
func (t *Tracker) Nominated(uid types.UID, node string) (Choice, bool) {
	v, ok := t.nominated.Load(uid)
	if !ok {
		return Choice{}, false
	}
	n := v.(nomination)
	return n.choice, n.node == node
}

// nominee reports whether an unbound pod in a node's view is there because
// it is nominated to the node.
func (t *Tracker) nominee(pod *v1.Pod, node string) bool {
	if pod.Status.NominatedNodeName == node {
		return true
	}
	_, here := t.Nominated(pod.UID, node)
	return here
}

// holdForNominees counts the pods the scheduler's filters add to a node
// because they are nominated to it: they are not bound, so they hold what
// their preemption freed for them (Nominate), or else what their request
// takes where it is free (the free whole devices, up to its count, when
// there are fewer than it needs). Their victims may still hold those
// devices, so a nominee never makes the node overcommitted: it holds what it
// can.
func (t *Tracker) holdForNominees(st *NodeState, pods []*v1.Pod) {
	var any Request
	for k, pod := range pods {
		if slices.ContainsFunc(pods[:k], func(q *v1.Pod) bool { return q.UID == pod.UID }) {
			continue // listed twice: it holds once
		}
		req, err := ParseRequest(pod, t.reqOpts)
		if err != nil || !req.HasGPU() {
			continue
		}
		if c, ok := t.Nominated(pod.UID, st.Name); ok {
			for i := 0; i < int(st.Count); i++ {
				if c.Mask&(1<<uint(i)) != 0 {
					st.holdFor(i, c.Milli, &c.Share, &any)
				}
			}
			continue
		}
		// What it can take now, tightest first: for whole GPUs, the free
		// ones even if fewer than it needs (its victims hold the rest).
		out, devices, milli, mask := st.fit(&req)
		if out != Fits && out != TooFewFreeDevices {
			continue
		}
		_, sh := req.AgentShare()
		for n := int32(0); n < devices && mask != 0; n++ {
			// The tightest device that takes it, as our own choices go.
			best := -1
			for m := mask; m != 0; m &= m - 1 {
				i := bits.TrailingZeros64(m)
				if best < 0 || st.Free[i] < st.Free[best] {
					best = i
				}
			}
			mask &^= 1 << uint(best)
			st.holdFor(best, milli, &sh, &any)
		}
	}
}

// holdFor takes a share of device i for a nominee, as much of it as is
// left: never past the device's capacity.
func (s *NodeState) holdFor(i int, milli int32, sh *DeviceShare, any *Request) {
	if s.agent == nil {
		s.Free[i] = max(s.Free[i]-milli, 0)
		return
	}
	if s.agent.admits(i, any, sh) {
		s.takeShare(i, *sh)
		return
	}
	// What is left of it is the nominee's: no slot stays for another pod.
	d := &s.agent.devs[i]
	s.takeUse(i, 0, 0, max(d.Slots-s.agent.slots[i], 0))
}
