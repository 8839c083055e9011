//go:build race

package plugins_test

// raceEnabled: sync.Pool drops items at random under the race detector, so
// allocation counts vary.
const raceEnabled = true
