package trajectory

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// ManifestName is the run manifest file in a run directory.
const ManifestName = "run.json"

// Run states recorded in run.json.
const (
	RunRunning = "running"
	RunClosed  = "closed"
	RunFailed  = "failed"
)

// RunManifest is the content of run.json: what produced the run and which
// finished files belong to it. It is rewritten atomically after every file
// rotation, so it may lag the directory by at most one file after a crash;
// readers also accept finished part files it does not list yet.
type RunManifest struct {
	SchemaVersion int               `json:"schema_version"`
	RunID         string            `json:"run_id"`
	State         string            `json:"state"`
	Error         string            `json:"error,omitempty"`
	CreatedAt     time.Time         `json:"created_at"`
	UpdatedAt     time.Time         `json:"updated_at"`
	Config        json.RawMessage   `json:"config,omitempty"`
	Versions      map[string]string `json:"versions,omitempty"`
	// Sampler is the effective sampler every generation request stated
	// and, where the server reports it, the server's own view
	// (inference.SamplerReport; docs/inference.md, "Honest sampling").
	Sampler json.RawMessage `json:"sampler,omitempty"`
	Counts  RunCounts       `json:"counts"`
	Files   []FileEntry     `json:"files"`
}

// RunCounts totals the rows in the finished files of a run.
type RunCounts struct {
	Rows        int64 `json:"rows"`
	OK          int64 `json:"ok"`
	InfraFailed int64 `json:"infra_failed"`
	// SampledTokens counts the ids the ok rows sampled (trained, loss_mask
	// 1, plus unscored); UnscoredTokens those of them without a logprob
	// (unscored_tokens), untrained. Files written before these counts
	// existed leave both 0 until rows of them are counted again.
	SampledTokens  int64 `json:"sampled_tokens"`
	UnscoredTokens int64 `json:"unscored_tokens"`
	// Lost counts records accepted by Write that never reached a finished
	// file because of a write error.
	Lost int64 `json:"lost,omitempty"`
}

// UnscoredShare is UnscoredTokens / SampledTokens (0 without samples).
func (c RunCounts) UnscoredShare() float64 {
	if c.SampledTokens == 0 {
		return 0
	}
	return float64(c.UnscoredTokens) / float64(c.SampledTokens)
}

// sampledTokens returns the ids an ok record sampled and how many of
// them have no logprob.
func sampledTokens(rec *Record) (sampled, unscored int64) {
	if rec.Status != StatusOK {
		return 0, 0
	}
	for _, m := range rec.LossMask {
		if m == 1 {
			sampled++
		}
	}
	return sampled + int64(rec.UnscoredTokens), int64(rec.UnscoredTokens)
}

// FileEntry describes one finished part file.
type FileEntry struct {
	Name        string    `json:"name"`
	Rows        int64     `json:"rows"`
	Groups      int64     `json:"groups,omitempty"` // groups (units of WriteGroup) in the file
	Bytes       int64     `json:"bytes"`
	TokenValues int64     `json:"token_values"`
	FinishedAt  time.Time `json:"finished_at"`
}

// ErrNoManifest is returned (wrapped) when a directory has no run.json.
var ErrNoManifest = errors.New("no run.json")

// ReadManifest reads dir/run.json. A manifest from a newer schema is refused
// with ErrNewerSchema.
func ReadManifest(dir string) (*RunManifest, error) {
	path := filepath.Join(dir, ManifestName)
	b, err := os.ReadFile(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s: %w (not a run directory?)", path, ErrNoManifest)
		}
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var m RunManifest
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: run.json is not valid JSON: %v", ErrForeignFile, err)}
	}
	if m.SchemaVersion == 0 {
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: run.json has no schema_version", ErrForeignFile)}
	}
	if m.SchemaVersion > SchemaVersion {
		return nil, &FileError{Path: path, Err: fmt.Errorf("%w: run written with schema version %d, this build reads up to %d; upgrade rollout", ErrNewerSchema, m.SchemaVersion, SchemaVersion)}
	}
	return &m, nil
}

// writeManifest replaces dir/run.json atomically: temp file, fsync, rename,
// fsync of the directory. A reader sees the old or the new manifest, never a
// mix.
func writeManifest(dir string, m *RunManifest) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("encode run.json: %w", err)
	}
	b = append(b, '\n')
	return writeFileAtomic(dir, ManifestName, b)
}

func writeFileAtomic(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("create %s: %w", tmp, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("sync %s: %w", tmp, err)
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("close %s: %w", tmp, err)
	}
	final := filepath.Join(dir, name)
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("rename %s: %w", final, err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open dir %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync dir %s: %w", dir, err)
	}
	return nil
}
