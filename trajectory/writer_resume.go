package trajectory

// Resuming a run directory: counting the groups already written, replaying
// the journals a crash left, adopting part files finished but not listed.

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// countGroups sets the next group sequence number from run.json; files
// listed by an older release without a group count are read.
func (w *Writer) countGroups() error {
	w.groups = 0
	for i := range w.manifest.Files {
		fe := &w.manifest.Files[i]
		if fe.Groups == 0 && fe.Rows > 0 {
			n, err := countFileGroups(filepath.Join(w.dir, fe.Name))
			if err != nil {
				return fmt.Errorf("resume run dir: %w", err)
			}
			fe.Groups = n
		}
		w.groups += fe.Groups
	}
	return nil
}

func countFileGroups(path string) (int64, error) {
	f, err := OpenFile(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var n int64
	last, first := "", true
	err = f.Each(context.Background(), func(rec *Record) error {
		if first || rec.GroupID != last {
			n++
		}
		first, last = false, rec.GroupID
		return nil
	})
	return n, err
}

// recoverJournals compacts the journals a crash left without their part
// file into that part file, and deletes journals whose part file exists
// (the crash came between the rename and the delete).
func (w *Writer) recoverJournals() error {
	pending, obsolete, maxNum, err := pendingJournals(w.dir)
	if err != nil {
		return fmt.Errorf("list run dir %s: %w", w.dir, err)
	}
	for _, name := range obsolete {
		if err := os.Remove(filepath.Join(w.dir, name)); err != nil {
			return fmt.Errorf("remove compacted journal: %w", err)
		}
	}
	if maxNum >= w.next {
		w.next = maxNum + 1
	}
	for _, name := range pending {
		path := filepath.Join(w.dir, name)
		recs, st, err := ReadJournal(path, w.log)
		if err != nil {
			return fmt.Errorf("resume run dir: %w", err)
		}
		if len(recs) > 0 {
			if err := w.openPartNamed(partOfJournal(name), false); err != nil {
				return fmt.Errorf("resume run dir: compact %s: %w", name, err)
			}
			for i := range recs {
				if err := w.appendRow(&recs[i]); err != nil {
					return fmt.Errorf("resume run dir: compact %s: %w", name, err)
				}
			}
			if err := w.finishPart(); err != nil {
				return fmt.Errorf("resume run dir: compact %s: %w", name, err)
			}
			w.log.Info("trajectory journal compacted into its part file", "journal", name, "groups", st.Frames, "rows", st.Records)
		}
		if err := os.Remove(path); err != nil {
			return fmt.Errorf("remove compacted journal: %w", err)
		}
	}
	if len(pending) > 0 {
		if err := syncDir(w.dir); err != nil {
			return err
		}
	}
	return nil
}

// adoptUnlisted adds finished part files that a crash left out of run.json
// (renamed, manifest not yet rewritten) so that counts stay exact on resume.
func (w *Writer) adoptUnlisted() error {
	names, err := partFiles(w.dir)
	if err != nil {
		return fmt.Errorf("list run dir %s: %w", w.dir, err)
	}
	listed := map[string]bool{}
	for _, fe := range w.manifest.Files {
		listed[fe.Name] = true
	}
	for _, name := range names {
		if listed[name] {
			continue
		}
		path := filepath.Join(w.dir, name)
		f, err := OpenFile(path)
		if err != nil {
			return fmt.Errorf("resume run dir: %w", err)
		}
		fe := FileEntry{Name: name, FinishedAt: time.Now().UTC()}
		var ok, infra, sampled, unscored int64
		last := ""
		err = f.Each(context.Background(), func(rec *Record) error {
			if fe.Rows == 0 || rec.GroupID != last {
				fe.Groups++
			}
			last = rec.GroupID
			fe.Rows++
			fe.TokenValues += int64(len(rec.Tokens))
			if rec.Status == StatusOK {
				ok++
			} else {
				infra++
			}
			sm, un := sampledTokens(rec)
			sampled += sm
			unscored += un
			return nil
		})
		f.Close()
		if err != nil {
			return fmt.Errorf("resume run dir: %w", err)
		}
		if st, err := os.Stat(path); err == nil {
			fe.Bytes = st.Size()
		}
		w.manifest.Files = append(w.manifest.Files, fe)
		w.manifest.Counts.Rows += fe.Rows
		w.manifest.Counts.OK += ok
		w.manifest.Counts.InfraFailed += infra
		w.manifest.Counts.SampledTokens += sampled
		w.manifest.Counts.UnscoredTokens += unscored
		w.log.Warn("adopted part file missing from run.json", "file", name, "rows", fe.Rows)
	}
	return nil
}

func isTempName(name string) bool {
	return len(name) > 0 && name[0] == '.' && filepath.Ext(name) == ".tmp"
}
