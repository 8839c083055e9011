package hami

import (
	"fmt"
	"strings"
	"time"
)

// NodeLockValue is the lock a scheduler takes for a pod:
// `<RFC3339 time>,<namespace>,<name>`.
func NodeLockValue(now time.Time, namespace, name string) string {
	return now.Format(time.RFC3339) + lockSep + namespace + lockSep + name
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
