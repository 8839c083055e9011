package gpufit

import (
	"fmt"
	"testing"

	v1 "k8s.io/api/core/v1"
	st "k8s.io/kubernetes/pkg/scheduler/testing"
)

// BenchmarkNarrowCandidates: a backlog left out of the walk, and a stream
// of pods passing through the queue (seen, queued, attempted, bound), the
// queue asking for the candidates after each step, as bound-pod events do
// while a stream is scheduled. One op is one stream pod.
func BenchmarkNarrowCandidates(b *testing.B) {
	for _, backlog := range []int{2000, 20000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			n := newNarrower(nil, nil)
			n.check.Do(func() { n.usable = true })
			for i := 0; i < backlog; i++ {
				p := st.MakePod().Namespace("b").Name(fmt.Sprintf("backlog-%d", i)).UID(fmt.Sprintf("b%d", i)).Obj()
				n.observe(p)
				n.move(p, stBlind)
			}
			stream := make([]*v1.Pod, 1000)
			for i := range stream {
				stream[i] = st.MakePod().Namespace("s").Name(fmt.Sprintf("stream-%d", i)).UID(fmt.Sprintf("s%d", i)).Obj()
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				p := stream[i%len(stream)]
				n.observe(p)
				_ = n.candidates()
				n.move(p, stQueued)
				_ = n.candidates()
				n.move(p, stAttempting)
				_ = n.candidates()
				n.forget(p)
			}
		})
	}
}
