package atropos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Spool layout (one directory per bridge):
//
//	segment-00000001.jsonl  append-only, one spoolEntry per line, fsynced per line
//	cursor.json             {"acked_seq": N}: every entry with seq <= N was delivered
//	rejected.jsonl          append-only dead letters: groups the API refused, with the reason
//	handed.log              append-only group ids the bridge is done with (delivered, refused or
//	                        skipped), fsynced before the cursor moves past them
//	since.json              {"from_sequence": N}: the run directory's groups from N on are the
//	                        bridge's (written when the spool is created)
//
// Every group is written to a segment before it is sent, so a crash, an API
// outage or an API restart loses nothing; the sender replays entries in seq
// order and advances the cursor after each delivery. A crash between a
// delivery and the cursor update re-sends that group once on the next start
// (the API has no idempotency key), which is the only duplicate possible.
const (
	segmentPrefix = "segment-"
	segmentSuffix = ".jsonl"
	cursorName    = "cursor.json"
	rejectedName  = "rejected.jsonl"
	handedName    = "handed.log"
	sinceName     = "since.json"
)

// spoolEntry is one line of a segment: a group as it will be POSTed, minus
// env_id, which is only known (and may change) at send time.
type spoolEntry struct {
	Seq       uint64          `json:"seq"`
	GroupID   string          `json:"group_id"`
	RunID     string          `json:"run_id,omitempty"`
	SpooledAt time.Time       `json:"spooled_at"`
	Sequences int             `json:"sequences"`
	MaxLen    int             `json:"max_len"`
	Group     json.RawMessage `json:"group"`
}

// deadLetter is one line of rejected.jsonl.
type deadLetter struct {
	Seq        uint64          `json:"seq"`
	GroupID    string          `json:"group_id"`
	RunID      string          `json:"run_id,omitempty"`
	RejectedAt time.Time       `json:"rejected_at"`
	Status     int             `json:"status,omitempty"`
	Reason     string          `json:"reason"`
	Group      json.RawMessage `json:"group"`
}

// entryRef locates a pending entry on disk; the bodies stay there.
type entryRef struct {
	seq     uint64
	seg     int
	off     int64
	n       int
	groupID string
	maxLen  int
}

type spool struct {
	dir      string
	segBytes int64

	mu      sync.Mutex
	w       *os.File // current write segment
	wseg    int
	wsize   int64
	nextSeq uint64
	acked   uint64
	scanned uint64 // last seq seen by index (seqs only grow)
	pending []entryRef
	perSeg  map[int]int // pending entries per segment
	rej     *os.File
	handed  *os.File
	closed  bool
}

func segmentName(n int) string { return fmt.Sprintf("%s%08d%s", segmentPrefix, n, segmentSuffix) }

// openSpool opens (or creates) the spool in dir, truncates a torn last line
// left by a crash, indexes the entries not yet delivered and starts a new
// write segment.
func openSpool(dir string, segBytes int64) (*spool, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("create spool dir: %w", err)
	}
	s := &spool{dir: dir, segBytes: segBytes, perSeg: map[int]int{}}
	if err := s.readCursor(); err != nil {
		return nil, err
	}
	segs, err := s.segments()
	if err != nil {
		return nil, err
	}
	maxSeq := s.acked
	for _, n := range segs {
		last, err := s.index(n)
		if err != nil {
			return nil, err
		}
		maxSeq = max(maxSeq, last)
		if s.perSeg[n] == 0 {
			if err := os.Remove(filepath.Join(dir, segmentName(n))); err != nil {
				return nil, fmt.Errorf("remove delivered spool segment: %w", err)
			}
		}
		s.wseg = max(s.wseg, n)
	}
	s.nextSeq = maxSeq + 1
	if err := s.rotate(); err != nil {
		return nil, err
	}
	s.rej, err = os.OpenFile(filepath.Join(dir, rejectedName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		_ = s.w.Close()
		return nil, fmt.Errorf("open spool dead letters: %w", err)
	}
	s.handed, err = os.OpenFile(filepath.Join(dir, handedName), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		_ = s.w.Close()
		_ = s.rej.Close()
		return nil, fmt.Errorf("open spool hand-off log: %w", err)
	}
	return s, nil
}

// markHanded records durably that the bridge is done with these groups.
func (s *spool) markHanded(ids []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.markHandedLocked(ids)
}

func (s *spool) markHandedLocked(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	if s.closed {
		return ErrClosed
	}
	var b bytes.Buffer
	for _, id := range ids {
		b.WriteString(strconv.Quote(id))
		b.WriteByte('\n')
	}
	if _, err := s.handed.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write spool hand-off log: %w", err)
	}
	if err := s.handed.Sync(); err != nil {
		return fmt.Errorf("sync spool hand-off log: %w", err)
	}
	return nil
}

// known returns the groups the bridge has seen: done with (handed.log) or
// still pending in the spool. A torn last line of handed.log is ignored:
// its group was still pending when the crash came.
func (s *spool) known() (map[string]bool, error) {
	out := map[string]bool{}
	b, err := os.ReadFile(filepath.Join(s.dir, handedName))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read spool hand-off log: %w", err)
	}
	for len(b) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			break
		}
		id, err := strconv.Unquote(string(b[:i]))
		if err != nil {
			return nil, fmt.Errorf("spool hand-off log %s: corrupt line %q", filepath.Join(s.dir, handedName), b[:i])
		}
		out[id] = true
		b = b[i+1:]
	}
	s.mu.Lock()
	for _, r := range s.pending {
		out[r.groupID] = true
	}
	s.mu.Unlock()
	return out, nil
}

func (s *spool) readCursor() error {
	b, err := os.ReadFile(filepath.Join(s.dir, cursorName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read spool cursor: %w", err)
	}
	var c struct {
		AckedSeq uint64 `json:"acked_seq"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return fmt.Errorf("spool cursor %s: %w", filepath.Join(s.dir, cursorName), err)
	}
	s.acked = c.AckedSeq
	return nil
}

func (s *spool) segments() ([]int, error) {
	ents, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("list spool dir: %w", err)
	}
	var segs []int
	for _, e := range ents {
		name := e.Name()
		if !strings.HasPrefix(name, segmentPrefix) || !strings.HasSuffix(name, segmentSuffix) {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(name, segmentPrefix), segmentSuffix))
		if err != nil {
			continue
		}
		segs = append(segs, n)
	}
	sort.Ints(segs)
	return segs, nil
}

// index scans one segment and queues its undelivered entries. A last line
// without its newline is the torn write of a crash (the group was never
// acknowledged to the runner) and is cut off.
func (s *spool) index(n int) (uint64, error) {
	path := filepath.Join(s.dir, segmentName(n))
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return 0, fmt.Errorf("open spool segment: %w", err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 1<<20)
	var off int64
	var last uint64
	for {
		line, err := r.ReadBytes('\n')
		if errors.Is(err, io.EOF) {
			if len(line) > 0 {
				if terr := f.Truncate(off); terr != nil {
					return 0, fmt.Errorf("truncate torn spool line in %s: %w", path, terr)
				}
				if serr := f.Sync(); serr != nil {
					return 0, fmt.Errorf("sync %s: %w", path, serr)
				}
			}
			return last, nil
		}
		if err != nil {
			return 0, fmt.Errorf("read spool segment %s: %w", path, err)
		}
		var head spoolEntry
		err = json.Unmarshal(line, &head)
		switch {
		case err != nil:
		case head.Seq == 0 || len(head.Group) == 0 || head.Group[0] != '{':
			err = errors.New("no seq or no group object")
		case head.Seq <= s.scanned:
			err = fmt.Errorf("seq %d after seq %d", head.Seq, s.scanned)
		}
		if err != nil {
			return 0, fmt.Errorf("spool segment %s: corrupt entry at byte %d: %w", path, off, err)
		}
		last, s.scanned = head.Seq, head.Seq
		if head.Seq > s.acked {
			s.pending = append(s.pending, entryRef{seq: head.Seq, seg: n, off: off, n: len(line), groupID: head.GroupID, maxLen: head.MaxLen})
			s.perSeg[n]++
		}
		off += int64(len(line))
	}
}

// rotate starts a new write segment.
func (s *spool) rotate() error {
	if s.w != nil {
		if err := s.w.Close(); err != nil {
			return fmt.Errorf("close spool segment: %w", err)
		}
		if s.perSeg[s.wseg] == 0 {
			_ = os.Remove(filepath.Join(s.dir, segmentName(s.wseg)))
		}
	}
	s.wseg++
	f, err := os.OpenFile(filepath.Join(s.dir, segmentName(s.wseg)), os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create spool segment: %w", err)
	}
	if err := syncDir(s.dir); err != nil {
		_ = f.Close()
		return err
	}
	s.w, s.wsize = f, 0
	return nil
}

// append durably adds e (its Seq is assigned here) and queues it.
func (s *spool) append(e *spoolEntry) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	if s.wsize >= s.segBytes {
		if err := s.rotate(); err != nil {
			return err
		}
	}
	e.Seq = s.nextSeq
	line, err := marshalLine(e)
	if err != nil {
		return fmt.Errorf("encode spool entry: %w", err)
	}
	if _, err := s.w.Write(line); err != nil {
		// Cut a partial line so the next entry starts on a boundary.
		_ = s.w.Truncate(s.wsize)
		return fmt.Errorf("write spool: %w", err)
	}
	if err := s.w.Sync(); err != nil {
		_ = s.w.Truncate(s.wsize)
		return fmt.Errorf("sync spool: %w", err)
	}
	s.pending = append(s.pending, entryRef{seq: e.Seq, seg: s.wseg, off: s.wsize, n: len(line), groupID: e.GroupID, maxLen: e.MaxLen})
	s.perSeg[s.wseg]++
	s.wsize += int64(len(line))
	s.nextSeq++
	return nil
}

// len is the number of entries not yet delivered.
func (s *spool) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.pending)
}

// peek returns up to n oldest pending entries whose lines sum to at most
// maxBytes (always at least one).
func (s *spool) peek(n int, maxBytes int) []entryRef {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []entryRef
	size := 0
	for _, r := range s.pending {
		if len(out) == n || (len(out) > 0 && size+r.n > maxBytes) {
			break
		}
		out = append(out, r)
		size += r.n
	}
	return out
}

// read loads the entry ref points to.
func (s *spool) read(ref entryRef) (spoolEntry, error) {
	var e spoolEntry
	f, err := os.Open(filepath.Join(s.dir, segmentName(ref.seg)))
	if err != nil {
		return e, fmt.Errorf("open spool segment: %w", err)
	}
	defer f.Close()
	buf := make([]byte, ref.n)
	if _, err := f.ReadAt(buf, ref.off); err != nil {
		return e, fmt.Errorf("read spool entry %d: %w", ref.seq, err)
	}
	if err := json.Unmarshal(buf, &e); err != nil {
		return e, fmt.Errorf("decode spool entry %d: %w", ref.seq, err)
	}
	if e.Seq != ref.seq {
		return e, fmt.Errorf("spool entry at %s:%d has seq %d, want %d", segmentName(ref.seg), ref.off, e.Seq, ref.seq)
	}
	return e, nil
}

// ack marks the oldest len(refs) entries delivered; refs must be exactly
// those (the sender is the only consumer).
func (s *spool) ack(refs []entryRef) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(refs) == 0 {
		return nil
	}
	if len(refs) > len(s.pending) {
		return fmt.Errorf("ack %d spool entries, %d pending", len(refs), len(s.pending))
	}
	for i, r := range refs {
		if s.pending[i].seq != r.seq {
			return fmt.Errorf("ack of spool entry %d out of order (oldest pending is %d)", r.seq, s.pending[i].seq)
		}
	}
	last := refs[len(refs)-1].seq
	ids := make([]string, len(refs))
	for i, r := range refs {
		ids[i] = r.groupID
	}
	if err := s.markHandedLocked(ids); err != nil {
		return err
	}
	if err := s.writeCursor(last); err != nil {
		return err
	}
	s.acked = last
	s.pending = s.pending[len(refs):]
	for _, r := range refs {
		s.perSeg[r.seg]--
		if s.perSeg[r.seg] == 0 {
			delete(s.perSeg, r.seg)
			if r.seg != s.wseg {
				_ = os.Remove(filepath.Join(s.dir, segmentName(r.seg)))
			}
		}
	}
	return nil
}

// reject moves the oldest pending entry to the dead letters with a reason.
func (s *spool) reject(ref entryRef, e *spoolEntry, status int, reason string) error {
	line, err := marshalLine(&deadLetter{Seq: e.Seq, GroupID: e.GroupID, RunID: e.RunID, RejectedAt: time.Now().UTC(), Status: status, Reason: reason, Group: e.Group})
	if err != nil {
		return fmt.Errorf("encode dead letter: %w", err)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	_, err = s.rej.Write(line)
	if err == nil {
		err = s.rej.Sync()
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("write spool dead letter: %w", err)
	}
	return s.ack([]entryRef{ref})
}

func (s *spool) writeCursor(seq uint64) error {
	tmp := filepath.Join(s.dir, cursorName+".tmp")
	f, err := os.Create(tmp)
	if err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	_, err = fmt.Fprintf(f, "{\"acked_seq\":%d}\n", seq)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(s.dir, cursorName))
	}
	if err != nil {
		return fmt.Errorf("write spool cursor: %w", err)
	}
	return syncDir(s.dir)
}

func (s *spool) close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	err := s.w.Close()
	if s.perSeg[s.wseg] == 0 {
		_ = os.Remove(filepath.Join(s.dir, segmentName(s.wseg)))
	}
	if rerr := s.rej.Close(); err == nil {
		err = rerr
	}
	if herr := s.handed.Close(); err == nil {
		err = herr
	}
	if err != nil {
		return fmt.Errorf("close spool: %w", err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync spool dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync spool dir: %w", err)
	}
	return nil
}

// marshalLine encodes v as one JSON line without HTML escaping (message
// text keeps its < and >, and stays smaller).
func marshalLine(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}
