// Command e2ematrix reads the go test -json output of the e2e suite at each
// Kubernetes minor (FILE named <minor>.json) and prints a matrix of every
// test by minor: pass, FAIL, or skip with the reason the test gave.
//
//	go run ./hack/e2ematrix out/e2e-versions/1.35.json out/e2e-versions/1.36.json ...
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

type event struct {
	Action string
	Test   string
	Output string
}

type result struct {
	state  string // pass, FAIL, skip, or "-" (did not run)
	reason string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: e2ematrix <minor>.json ...")
		os.Exit(2)
	}
	var minors []string
	results := map[string]map[string]result{} // test -> minor -> result
	failed := false
	var aborted, failures []string
	for _, path := range os.Args[1:] {
		minor := strings.TrimSuffix(filepath.Base(path), ".json")
		minors = append(minors, minor)
		res, fails, ended, err := read(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "e2ematrix:", err)
			os.Exit(1)
		}
		if !ended {
			aborted = append(aborted, minor)
			failed = true
		}
		for test, l := range fails {
			failures = append(failures, fmt.Sprintf("%s at %s:\n    %s", test, minor, strings.Join(l, "\n    ")))
		}
		for test, r := range res {
			if results[test] == nil {
				results[test] = map[string]result{}
			}
			results[test][minor] = r
			failed = failed || r.state == "FAIL"
		}
	}
	tests := make([]string, 0, len(results))
	for t := range results {
		tests = append(tests, t)
	}
	slices.Sort(tests)
	fmt.Printf("| test | %s |\n|---|%s\n", strings.Join(minors, " | "), strings.Repeat("---|", len(minors)))
	counts := map[string]map[string]int{}
	for _, t := range tests {
		cells := make([]string, len(minors))
		for i, m := range minors {
			r, ok := results[t][m]
			if !ok {
				r = result{state: "-"}
			}
			cells[i] = r.state
			if r.state == "skip" && r.reason != "" {
				cells[i] = "skip: " + r.reason
			}
			if counts[m] == nil {
				counts[m] = map[string]int{}
			}
			counts[m][r.state]++
		}
		fmt.Printf("| %s | %s |\n", t, strings.Join(cells, " | "))
	}
	fmt.Println()
	for _, m := range minors {
		c := counts[m]
		fmt.Printf("%s: %d pass, %d fail, %d skip\n", m, c["pass"], c["FAIL"], c["skip"])
	}
	for _, m := range aborted {
		fmt.Printf("%s: the suite did not end (crashed or timed out): its unfinished test counts as FAIL\n", m)
	}
	slices.Sort(failures)
	for _, f := range failures {
		fmt.Printf("\nFAIL %s\n", f)
	}
	if failed {
		os.Exit(1)
	}
}

// klogLine is a log line of a process the test started (I1202 12:00:00...).
var klogLine = regexp.MustCompile(`^[IWEF][0-9]{4} `)

// read returns each top-level test's result in one go test -json stream,
// the output tail of each that failed, and whether the suite ended
// normally. A test that started and never ended (the binary crashed or
// timed out) failed.
func read(path string) (map[string]result, map[string][]string, bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, false, err
	}
	defer f.Close()
	out := map[string]result{}
	lines := map[string][]string{} // the test's own output, klog lines left out
	ended := false
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		var e event
		if json.Unmarshal(sc.Bytes(), &e) != nil {
			continue
		}
		if e.Test == "" {
			if e.Action == "pass" || e.Action == "fail" {
				ended = true
			}
			continue
		}
		test := e.Test
		if i := strings.Index(test, "/"); i >= 0 {
			test = test[:i] // a subtest's lines and skips belong to its test
		}
		switch e.Action {
		case "run":
			if test == e.Test {
				out[test] = result{state: "FAIL", reason: "did not finish: the suite crashed or timed out"}
			}
		case "output":
			if line := strings.TrimSpace(e.Output); line != "" && !klogLine.MatchString(line) {
				lines[test] = append(lines[test], line)
			}
		case "pass", "fail", "skip":
			if test != e.Test {
				continue
			}
			switch e.Action {
			case "pass":
				out[test] = result{state: "pass"}
			case "fail":
				out[test] = result{state: "FAIL"}
			case "skip":
				out[test] = result{state: "skip", reason: strings.ReplaceAll(skipReason(lines[test]), "|", "/")}
			}
		}
	}
	fails := map[string][]string{}
	for t, r := range out {
		if r.state == "FAIL" {
			l := lines[t]
			fails[t] = l[max(0, len(l)-15):]
		}
	}
	return out, fails, ended, sc.Err()
}

// skipReason is the message of the last "file_test.go:NN: message" line.
func skipReason(lines []string) string {
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		if strings.HasPrefix(line, "---") || strings.HasPrefix(line, "===") {
			continue
		}
		if i := strings.Index(line, "_test.go:"); i > 0 {
			if j := strings.Index(line[i:], ": "); j >= 0 {
				return line[i+j+2:]
			}
		}
	}
	return ""
}
