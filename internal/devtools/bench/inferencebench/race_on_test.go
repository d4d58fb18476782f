//go:build race

package inferencebench

// The race detector caps live goroutines at 8128; a 4,096-request burst
// against an in-process server needs more.
const raceEnabled = true
