//go:build !race

package gpuscore_test

const raceEnabled = false
