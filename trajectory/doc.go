// Package trajectory owns the trajectory record schema (Record, one Parquet
// row per rollout), the crash-safe Parquet writer of run directories
// (NewWriter: rolling part files written under temp names, fsynced and
// renamed, plus an atomically replaced run.json), the reader (Open,
// ReadFile) with file-level errors, the SFT/DPO/Atropos exports, eval
// reports (metrics.json, samples.jsonl), the run summary and the static HTML
// viewer. The on-disk format is documented in docs/trajectory-schema.md.
package trajectory
