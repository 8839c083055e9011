package version

import (
	"strings"
	"testing"
)

func TestCheckServer(t *testing.T) {
	for _, tc := range []struct {
		major, minor string
		ok           bool
	}{
		{"1", "35", true}, {"1", "36+", true}, {"1", "37", true},
		{"1", "34", false}, {"1", "38", false}, {"2", "0", false}, {"1", "x", false},
	} {
		err := CheckServer(tc.major, tc.minor)
		if (err == nil) != tc.ok {
			t.Errorf("%s.%s: %v", tc.major, tc.minor, err)
		}
		if err != nil && !strings.Contains(err.Error(), Supported()) {
			t.Errorf("%s.%s: the error does not name the supported versions: %v", tc.major, tc.minor, err)
		}
	}
}
