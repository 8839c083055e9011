// Package objects compares the parts of Kubernetes objects that event
// handlers look at to tell a real change from a heartbeat.
package objects

import v1 "k8s.io/api/core/v1"

// EqualResources reports whether two resource lists hold the same amounts.
func EqualResources(a, b v1.ResourceList) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || v.Cmp(w) != 0 {
			return false
		}
	}
	return true
}
