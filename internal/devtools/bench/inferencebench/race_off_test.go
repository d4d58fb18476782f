//go:build !race

package inferencebench

const raceEnabled = false
