package gpuscore

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpu-scheduler/gpu-scheduler/pkg/gpu"
)

// publishPeriod is how often the leader looks whether its learned target
// changed, and publishes it if so (a variable for tests).
var publishPeriod = 10 * time.Second

// republishAfter is how old an entry with the same tasks may grow before
// the weights learned since are written too: a reader replays the pods
// created after the entry, and deleted ones are gone (a variable for tests).
var republishAfter = time.Minute

// maxEntryBytes bounds a profile's entry on the lease (gpu.ExportedWorkload.Trim).
const maxEntryBytes = 32 << 10

// publisher writes the profile's learned target on the scheduler's lease
// (annotation gpu.AnnotationTargetWorkload, one entry per profile), so that
// kubectl gpu reads the target as the scheduler holds it: learned from
// every pod it saw, deleted ones too. The lease is the scheduler's own
// object (its RBAC may update it, and nothing else); the leader elector
// keeps the annotation, since it updates the lease it read. Only the
// leader publishes, and only a change.
type publisher struct {
	client   kubernetes.Interface
	ns, name string
	profile  string
	leading  func() bool
	// export is the target and its export (gpu.Learner.Export).
	export func(time.Time) (*gpu.Workload, gpu.ExportedWorkload)
	// elected: the process runs leader election on this lease; without
	// it, its entry says so (no holder) and it writes only if no
	// elected leader holds the lease.
	elected bool
	// last is the target last written or found on the lease; checked when
	// the lease was last read or written for it (for an entry too recent to
	// replace, the entry's time).
	last    *gpu.Workload
	checked time.Time
}

func newPublisher(client kubernetes.Interface, lease, profile string, elected bool, leading func() bool,
	export func(time.Time) (*gpu.Workload, gpu.ExportedWorkload)) *publisher {
	ns, name, _ := strings.Cut(lease, "/")
	return &publisher{client: client, ns: ns, name: name, profile: profile, elected: elected, leading: leading, export: export}
}

func (p *publisher) run(ctx context.Context) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := p.publish(ctx, time.Now()); err != nil {
			// kubectl gpu then reads a stale target, or none.
			klog.FromContext(ctx).Error(err, "could not publish the learned target workload", "lease", klog.KRef(p.ns, p.name))
		}
	}, publishPeriod)
}

// publish writes the current target if it changed since the last write.
func (p *publisher) publish(ctx context.Context, now time.Time) error {
	if !p.leading() {
		return nil
	}
	wl, exported := p.export(now)
	if wl == nil || (wl == p.last && now.Sub(p.checked) < republishAfter) {
		return nil
	}
	for attempt := 0; attempt < 3; attempt++ {
		l, err := p.client.CoordinationV1().Leases(p.ns).Get(ctx, p.name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return nil // no leader election: nobody to read it from
		}
		if err != nil {
			return err
		}
		holder := ptr.Deref(l.Spec.HolderIdentity, "")
		if !p.elected {
			holder = ""
		}
		all, err := gpu.ExportedWorkloads(l.Annotations[gpu.AnnotationTargetWorkload])
		if err != nil {
			all = map[string]gpu.ExportedWorkload{} // unreadable: ours replaces it
		}
		if old, ok := all[p.profile]; ok && old.Holder != "" && !p.elected {
			// The profile's elected leader publishes there: a process
			// of the same profile without leader election does not
			// overwrite it.
			p.last, p.checked = wl, now
			return nil
		}
		exported.Holder = holder
		exported.Trim(maxEntryBytes)
		// Tasks that weigh nearly the same: written once the entry is a
		// minute old, if anything was learned since (readers replay the
		// pods after it); other tasks at once.
		if old, ok := all[p.profile]; ok && old.Holder == holder && old.SimilarTasks(exported) {
			if old.SameTasks(exported) && old.SameWeights(exported) {
				p.last, p.checked = wl, now
				return nil
			}
			if now.Sub(old.At) < republishAfter {
				p.last, p.checked = wl, old.At
				return nil
			}
		}
		all[p.profile] = exported
		b, err := json.Marshal(all)
		if err != nil {
			return err
		}
		if l.Annotations == nil {
			l.Annotations = map[string]string{}
		}
		l.Annotations[gpu.AnnotationTargetWorkload] = string(b)
		// Update: the RBAC on the lease has no patch.
		_, err = p.client.CoordinationV1().Leases(p.ns).Update(ctx, l, metav1.UpdateOptions{})
		if apierrors.IsConflict(err) {
			continue // renewed meanwhile
		}
		if err != nil {
			return err
		}
		p.last, p.checked = wl, now
		return nil
	}
	return nil
}
