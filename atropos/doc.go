// Package atropos bridges the runner to an Atropos trainer: it acts as an Atropos environment against the run-api.
package atropos
