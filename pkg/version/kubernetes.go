package version

import (
	"fmt"
	"strconv"
	"strings"
)

// SupportedMinors are the Kubernetes minors (1.x) gpu-scheduler is tested
// against, oldest first: make e2e-versions runs the suite on each
// (hack/k8s-minors lists the releases built for it; a test keeps the two,
// the chart's kubeVersion and the README's matrix in step).
var SupportedMinors = []int{35, 36, 37}

// Supported is how the supported minors read: "1.35–1.37".
func Supported() string {
	return fmt.Sprintf("1.%d–1.%d", SupportedMinors[0], SupportedMinors[len(SupportedMinors)-1])
}

// CheckServer says why an API server of the given version (its /version
// major and minor) is not supported, or nil if it is. Managed services
// report minors such as "35+".
func CheckServer(major, minor string) error {
	mi, err := strconv.Atoi(strings.TrimRight(minor, "+"))
	if major != "1" || err != nil {
		return fmt.Errorf("gpu-scheduler %s supports Kubernetes %s; the API server reports version %s.%s, which it cannot read", Version, Supported(), major, minor)
	}
	for _, m := range SupportedMinors {
		if m == mi {
			return nil
		}
	}
	return fmt.Errorf("gpu-scheduler %s supports Kubernetes %s; the API server is 1.%d (docs/versions.md)", Version, Supported(), mi)
}
