// Package agent is the scheduler's side of the node agents that deliver the
// devices it chooses: HAMi's device plugin (pkg/agent/hami) and DRA drivers
// (pkg/agent/dra). An agent reports a node's devices and what the pods (or
// claims) there hold, in the domain's terms (gpu.Agent for HAMi, which also
// reads its request dialect; gpu.ClaimSource for DRA), and the domain
// package knows nothing of where an inventory comes from. Here is what a
// bind through an agent takes. The plugins hold a Delivery per pod and call
// it in this order: Hold, Others (the caller checks its choice against
// them), Verify, then the binding with Annotations; Release whenever the
// bind did not land. A DRA driver has no Binder: the DynamicResources
// plugin writes the allocation that travels with the binding and releases
// it when the bind fails (GPUDynamicResources only orders what it sees).
package agent

import (
	"context"
	"errors"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// Binder plans the deliveries of one agent.
type Binder interface {
	// Plan is the delivery of the chosen devices (in the node's device
	// order) to the pod, each taking share.
	Plan(pod *v1.Pod, node string, devs []gpu.Device, share gpu.DeviceShare) (Delivery, error)
	// NodeChanged is told of every change of a node the informer sees
	// (HAMi: a lock's release wakes the binds waiting for it).
	NodeChanged(old, new *v1.Node)
	// Clear is the keys of the agent's record on a pod (annotations and
	// labels), which a bind without the agent removes: an earlier attempt
	// on one of its nodes may have left them, and the agent would go on
	// counting the pod there.
	Clear() (annotations, labels []string)
}

// Delivery is one pod's bind through the agent.
type Delivery interface {
	// Hold takes what makes the agent serve this pod and no other while
	// it binds (HAMi: the node's lock), waiting while another bind holds
	// it. It gives an ErrBusy when the wait runs out.
	Hold(ctx context.Context) error
	// Others reads from the API server the pods the agent's other
	// clients placed on the node and may not be in the informer yet.
	Others(ctx context.Context) ([]v1.Pod, error)
	// Verify checks, just before the binding, that the hold is still
	// this bind's: a hold that expired or was taken over would have the
	// agent serve another pod's devices to this one.
	Verify(ctx context.Context) error
	// Annotations are what the agent reads, written with the binding.
	Annotations(now time.Time) map[string]string
	// Labels are what the agent's ecosystem reads from the pod's labels
	// (written only where the scheduler may patch pods).
	Labels() map[string]string
	// Release gives the hold back after a bind that did not land. It is
	// idempotent, and never releases a later hold of the same pod.
	Release(ctx context.Context) error
	// Held reports whether Hold has (or may have) taken the hold.
	Held() bool
}

// ErrBusy is a hold another bind has kept for as long as a bind waits.
type ErrBusy struct{ Err error }

func (e *ErrBusy) Error() string { return e.Err.Error() }
func (e *ErrBusy) Unwrap() error { return e.Err }

// IsBusy reports whether err is an ErrBusy.
func IsBusy(err error) bool {
	var b *ErrBusy
	return errors.As(err, &b)
}
