package hami

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
)

// NodeLockValue is the lock a scheduler takes for a pod:
// `<RFC3339 time>,<namespace>,<name>`. The time keeps its fraction of a
// second (HAMi parses RFC3339, which allows one), so that two holds of one
// pod have different values.
func NodeLockValue(now time.Time, namespace, name string) string {
	return now.Format(time.RFC3339Nano) + lockSep + namespace + lockSep + name
}

// ParseNodeLock reads a lock. A value without a comma is the legacy form, a
// bare time with no holder.
func ParseNodeLock(v string) (t time.Time, namespace, name string, err error) {
	if !strings.Contains(v, lockSep) {
		t, err = time.Parse(time.RFC3339, v)
		return t, "", "", err
	}
	p := strings.Split(v, lockSep)
	if len(p) != 3 {
		return time.Time{}, "", "", fmt.Errorf("malformed lock annotation: expected 3 parts, got %d from %s", len(p), v)
	}
	t, err = time.Parse(time.RFC3339, p[0])
	return t, p[1], p[2], err
}

// ErrLocked is returned when another pod holds a node's lock.
type ErrLocked struct {
	Node, Holder string
	Since        time.Time
}

func (e *ErrLocked) Error() string {
	return fmt.Sprintf("node %s is locked by %s since %s (HAMi's node lock: one bind at a time)", e.Node, e.Holder, e.Since.Format(time.RFC3339))
}

// HolderGone reports whether the pod a lock names, taken at since, will
// never be served under it (it no longer exists, say).
type HolderGone func(ctx context.Context, namespace, name string, since time.Time) (bool, error)

// LockNode takes the node's lock for the pod, as HAMi's LockNode does: a
// compare-and-swap on the node's resourceVersion. A lock older than expiry,
// or whose pod is gone, is released first, and so is one the pod's earlier
// attempt left (its cleanup then leaves the new one alone). It returns the lock's value, which identifies this hold (see
// ReleaseNodeLock); onWrite is called with it before it is written, so that
// a write whose answer is lost can still be released. Another live holder
// gives *ErrLocked; a malformed lock an error (HAMi's scheduler cannot lock
// the node either until it is fixed).
func LockNode(ctx context.Context, client kubernetes.Interface, node, namespace, name string, now time.Time, expiry time.Duration,
	gone HolderGone, onWrite func(value string)) (string, error) {
	for attempt := 0; attempt < 5; attempt++ {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return "", err
		}
		v, held := n.Annotations[AnnotationNodeLock]
		// The pod's earlier attempt is taken over in one write; another
		// pod's lock only once it is stale, by removing it first.
		if held {
			at, ns, nm, err := ParseNodeLock(v)
			if err != nil {
				return "", fmt.Errorf("node %s: unreadable %s %q: %w", node, AnnotationNodeLock, v, err)
			}
			if ns != namespace || nm != name {
				stale := now.Sub(at) > expiry
				if !stale && nm != "" {
					if g, err := gone(ctx, ns, nm, at); err == nil && g {
						stale = true
					}
				}
				if !stale {
					return "", &ErrLocked{Node: node, Holder: ns + "/" + nm, Since: at}
				}
				if err := patchLock(ctx, client, node, n.ResourceVersion, nil); err != nil && !apierrors.IsConflict(err) {
					return "", err
				}
				continue
			}
		}
		value := NodeLockValue(now, namespace, name)
		if value == v {
			value = NodeLockValue(now.Add(time.Nanosecond), namespace, name)
		}
		if onWrite != nil {
			onWrite(value)
		}
		if err := patchLock(ctx, client, node, n.ResourceVersion, &value); err != nil {
			if apierrors.IsConflict(err) {
				continue
			}
			return "", err
		}
		return value, nil
	}
	return "", fmt.Errorf("node %s: %s kept changing while taking it", node, AnnotationNodeLock)
}

// ReleaseStale drops the node's lock, if it is still value, when the pod it
// names is gone, or is judged stale: it ended before the device plugin
// served it (the kubelet rejected it while the plugin was down, say) or its
// bind was abandoned; nobody else releases such a lock, and HAMi's
// scheduler would wait out its expiry. It reports whether it did.
func ReleaseStale(ctx context.Context, client kubernetes.Interface, node, value string, stale func(p *v1.Pod, since time.Time) bool) (bool, error) {
	since, ns, name, err := ParseNodeLock(value)
	if err != nil || name == "" {
		return false, err
	}
	p, err := client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return false, err
	case !stale(p, since):
		return false, nil
	}
	return true, ReleaseNodeLock(ctx, client, node, value)
}

// ReleaseNodeLock drops the node's lock if it is still the given hold: a
// later hold of the same pod (a retry that took the lock again) is not
// released by an earlier attempt's cleanup.
func ReleaseNodeLock(ctx context.Context, client kubernetes.Interface, node, value string) error {
	for attempt := 0; attempt < 5; attempt++ {
		n, err := client.CoreV1().Nodes().Get(ctx, node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if n.Annotations[AnnotationNodeLock] != value {
			return nil // released, or someone else's now
		}
		if err := patchLock(ctx, client, node, n.ResourceVersion, nil); err != nil {
			if apierrors.IsConflict(err) {
				continue
			}
			return err
		}
		return nil
	}
	return fmt.Errorf("node %s: %s kept changing while releasing it", node, AnnotationNodeLock)
}

// patchLock sets (or, with nil, removes) the lock, only if the node is still
// at the resourceVersion read.
func patchLock(ctx context.Context, client kubernetes.Interface, node, rv string, value *string) error {
	var v any
	if value != nil {
		v = *value
	}
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations":     map[string]any{AnnotationNodeLock: v},
		"resourceVersion": rv,
	}})
	if err != nil {
		return err
	}
	_, err = client.CoreV1().Nodes().Patch(ctx, node, types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}
