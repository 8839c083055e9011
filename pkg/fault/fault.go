// Package fault holds fault-injection switches for tests. They exist only in
// binaries built with -tags faultinject (make gpu-scheduler-faultinject); in
// every other build they are constant false and compiled away.
package fault
