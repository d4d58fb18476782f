//go:build !race

package inference_test

const raceEnabled = false
