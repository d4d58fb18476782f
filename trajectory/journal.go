package trajectory

import (
	"bytes"
	"encoding/binary"
	"encoding/gob"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
)

// The journal makes every group durable the moment WriteGroup returns,
// long before its Parquet part file is finished.
//
// Each open part file part-NNNNN.parquet (written as a hidden temp file)
// has a journal part-NNNNN.journal beside it holding the same records:
//
//	file   = magic "RLJOURN1" (8 bytes) frame*
//	frame  = length u32 LE | crc32c(payload) u32 LE | crc32c(first 8 bytes) u32 LE | payload
//	payload = gob length u32 LE | gob encoding of journalFrame | columns
//	columns = per record: n u32 LE | tokens (n × int32 LE) | loss_mask (n × int8) | m u32 LE | logprobs (m × float32 LE)
//
// A frame holds one group (or one lone record). The token columns, the bulk
// of a record, are copied raw rather than through gob (masks are derived
// from tokens and loss_mask, as Record.Validate requires them to be); the
// callers of WriteGroup encode their frames concurrently, so the writer
// goroutine only appends bytes.
//
// The journal is created, its header fsynced and the directory fsynced
// before the first frame; each frame is fsynced before WriteGroup returns
// (frames queued meanwhile share one fsync). When the part file is finished
// (fsynced and renamed into place) the journal is deleted: the rename is the
// commit point, and a journal whose part file exists is obsolete. A journal
// without its part file is the tail of the run: readers read it after the
// part files, and NewWriter compacts it into its part file on resume.
//
// Reading stops at a torn tail (a crash mid-append: a short header, a frame
// running past the end of the file, a bad checksum in the last frame, or a
// zero-filled rest): it is dropped with a log line, and it can only hold
// groups that were never acknowledged. A bad checksum anywhere else is an
// ErrCorruptFile naming the file and the offset.

const (
	journalMagic   = "RLJOURN1"
	frameHeaderLen = 12
	maxFrameLen    = 1 << 30
	journalExt     = ".journal"
)

var (
	journalName = regexp.MustCompile(`^part-(\d{5,})\.journal$`)
	castagnoli  = crc32.MakeTable(crc32.Castagnoli)
)

// journalFrame is the payload of one frame.
type journalFrame struct {
	Records []Record
	// Present has a bit per optional (pointer) field of each record that
	// was set: gob drops a pointer to a zero value, which would turn an
	// advantage (or policy version, lag) of 0 into null on the way back.
	Present []uint8
}

// The optional fields Present tracks, one bit each.
func optionalFields(r *Record) []func(set bool) bool {
	return []func(set bool) bool{
		func(set bool) bool { return presentPtr(&r.PolicyVersion, set) },
		func(set bool) bool { return presentPtr(&r.Advantage, set) },
		func(set bool) bool { return presentPtr(&r.Failure, set) },
		func(set bool) bool { return presentPtr(&r.MinPolicyVersion, set) },
		func(set bool) bool { return presentPtr(&r.MaxPolicyVersion, set) },
		func(set bool) bool { return presentPtr(&r.PolicyLag, set) },
	}
}

// presentPtr reports whether *p is set; with set, it first gives a nil *p
// the zero value gob left out.
func presentPtr[T any](p **T, set bool) bool {
	if set && *p == nil {
		*p = new(T)
	}
	return *p != nil
}

func presentBits(r *Record) uint8 {
	var b uint8
	for i, f := range optionalFields(r) {
		if f(false) {
			b |= 1 << i
		}
	}
	return b
}

func restorePresent(r *Record, b uint8) {
	for i, f := range optionalFields(r) {
		if b&(1<<i) != 0 {
			f(true)
		}
	}
}

// journalPath is the journal of part file partName (part-NNNNN.parquet).
func journalPath(dir, partName string) string {
	return filepath.Join(dir, partName[:len(partName)-len(".parquet")]+journalExt)
}

// partOfJournal is the part file name a journal name belongs to.
func partOfJournal(name string) string {
	return name[:len(name)-len(journalExt)] + ".parquet"
}

// appendFrame appends the frame of recs to buf.
func appendFrame(buf *bytes.Buffer, recs []*Record) error {
	start := buf.Len()
	var hdr [frameHeaderLen + 4]byte
	buf.Write(hdr[:])
	fr := journalFrame{Records: make([]Record, len(recs)), Present: make([]uint8, len(recs))}
	cols := 0
	for i, r := range recs {
		fr.Records[i] = *r
		fr.Present[i] = presentBits(r)
		fr.Records[i].Tokens, fr.Records[i].LossMask, fr.Records[i].Masks, fr.Records[i].Logprobs = nil, nil, nil, nil
		cols += 8 + 9*len(r.Tokens) + 4*len(r.Logprobs)
	}
	if err := gob.NewEncoder(buf).Encode(&fr); err != nil {
		buf.Truncate(start)
		return fmt.Errorf("encode journal frame: %w", err)
	}
	binary.LittleEndian.PutUint32(buf.Bytes()[start+frameHeaderLen:], uint32(buf.Len()-start-frameHeaderLen-4))
	buf.Grow(cols)
	var tmp [4]byte
	for _, r := range recs {
		binary.LittleEndian.PutUint32(tmp[:], uint32(len(r.Tokens)))
		buf.Write(tmp[:])
		b := buf.AvailableBuffer()[:4*len(r.Tokens)+len(r.Tokens)]
		for i, t := range r.Tokens {
			binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
		}
		lm := b[4*len(r.Tokens):]
		for i, m := range r.LossMask {
			lm[i] = byte(m)
		}
		buf.Write(b)
		binary.LittleEndian.PutUint32(tmp[:], uint32(len(r.Logprobs)))
		buf.Write(tmp[:])
		b = buf.AvailableBuffer()[:4*len(r.Logprobs)]
		for i, f := range r.Logprobs {
			binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(f))
		}
		buf.Write(b)
	}
	b := buf.Bytes()[start:]
	payload := b[frameHeaderLen:]
	if len(payload) > maxFrameLen {
		buf.Truncate(start)
		return fmt.Errorf("journal frame of %d bytes exceeds %d", len(payload), maxFrameLen)
	}
	binary.LittleEndian.PutUint32(b[0:4], uint32(len(payload)))
	binary.LittleEndian.PutUint32(b[4:8], crc32.Checksum(payload, castagnoli))
	binary.LittleEndian.PutUint32(b[8:12], crc32.Checksum(b[0:8], castagnoli))
	return nil
}

// JournalStats describes one journal read.
type JournalStats struct {
	Frames, Records int
	// ValidBytes is the length of the intact prefix (header and whole
	// frames); TornBytes were dropped after it.
	ValidBytes, TornBytes int64
}

// readJournal calls fn for every intact frame of the journal at path. A torn
// tail is dropped (logged when log is non-nil); corruption before it is an
// ErrCorruptFile naming path and offset.
func readJournal(path string, log *slog.Logger, fn func(recs []Record) error) (JournalStats, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return JournalStats{}, &FileError{Path: path, Err: err}
	}
	return scanJournal(path, data, log, fn)
}

// scanJournal is readJournal on the journal's bytes.
func scanJournal(path string, data []byte, log *slog.Logger, fn func(recs []Record) error) (JournalStats, error) {
	var st JournalStats
	torn := func(off int64, why string) (JournalStats, error) {
		st.ValidBytes, st.TornBytes = off, int64(len(data))-off
		if log != nil {
			log.Warn("trajectory journal: torn tail dropped (a crash interrupted an unacknowledged write)",
				"file", path, "offset", off, "bytes", st.TornBytes, "why", why)
		}
		return st, nil
	}
	if len(data) < len(journalMagic) {
		if !bytes.HasPrefix([]byte(journalMagic), data) {
			return st, &FileError{Path: path, Err: fmt.Errorf("%w: offset 0: not a rollout journal (bad magic)", ErrCorruptFile)}
		}
		return torn(0, "header cut short")
	}
	if string(data[:len(journalMagic)]) != journalMagic {
		return st, &FileError{Path: path, Err: fmt.Errorf("%w: offset 0: not a rollout journal (bad magic)", ErrCorruptFile)}
	}
	off := int64(len(journalMagic))
	corrupt := func(off int64, format string, args ...any) error {
		return &FileError{Path: path, Err: fmt.Errorf("%w: offset %d: %s", ErrCorruptFile, off, fmt.Sprintf(format, args...))}
	}
	for off < int64(len(data)) {
		rest := data[off:]
		if len(rest) < frameHeaderLen {
			return torn(off, "frame header cut short")
		}
		n := binary.LittleEndian.Uint32(rest[0:4])
		sum := binary.LittleEndian.Uint32(rest[4:8])
		if crc32.Checksum(rest[0:8], castagnoli) != binary.LittleEndian.Uint32(rest[8:12]) {
			if allZero(rest) {
				return torn(off, "zero-filled tail")
			}
			return st, corrupt(off, "frame header checksum mismatch")
		}
		if n > maxFrameLen {
			return st, corrupt(off, "frame length %d exceeds %d", n, maxFrameLen)
		}
		end := off + frameHeaderLen + int64(n)
		if end > int64(len(data)) {
			return torn(off, "frame runs past the end of the file")
		}
		payload := data[off+frameHeaderLen : end]
		if crc32.Checksum(payload, castagnoli) != sum {
			if end == int64(len(data)) {
				return torn(off, "last frame's checksum mismatch")
			}
			return st, corrupt(off, "frame payload checksum mismatch")
		}
		fr, err := decodeFrame(payload)
		if err != nil {
			return st, corrupt(off, "frame does not decode: %v", err)
		}
		if err := fn(fr.Records); err != nil {
			return st, err
		}
		st.Frames++
		st.Records += len(fr.Records)
		off = end
	}
	st.ValidBytes = off
	return st, nil
}

// decodeFrame decodes a frame payload whose checksum matched.
func decodeFrame(payload []byte) (journalFrame, error) {
	var fr journalFrame
	if len(payload) < 4 {
		return fr, errors.New("payload shorter than its gob length")
	}
	n := binary.LittleEndian.Uint32(payload)
	if uint64(n) > uint64(len(payload)-4) {
		return fr, fmt.Errorf("gob length %d exceeds the payload", n)
	}
	if err := gob.NewDecoder(bytes.NewReader(payload[4 : 4+n])).Decode(&fr); err != nil {
		return fr, err
	}
	if fr.Present != nil && len(fr.Present) != len(fr.Records) {
		return fr, fmt.Errorf("%d presence entries for %d records", len(fr.Present), len(fr.Records))
	}
	for i, b := range fr.Present {
		restorePresent(&fr.Records[i], b)
	}
	for i := range fr.Records {
		// gob leaves out zero values and journals written before the
		// branch columns have none: branch 0's -1s come back here.
		fr.Records[i].Normalize()
	}
	rest := payload[4+n:]
	take := func(k int) ([]byte, error) {
		if k < 0 || k > len(rest) {
			return nil, errors.New("token columns cut short")
		}
		b := rest[:k]
		rest = rest[k:]
		return b, nil
	}
	for i := range fr.Records {
		r := &fr.Records[i]
		b, err := take(4)
		if err != nil {
			return fr, err
		}
		nt := int(binary.LittleEndian.Uint32(b))
		if b, err = take(5 * nt); err != nil {
			return fr, err
		}
		if nt > 0 {
			r.Tokens, r.LossMask, r.Masks = make([]int32, nt), make([]int8, nt), make([]int32, nt)
			for k := range nt {
				r.Tokens[k] = int32(binary.LittleEndian.Uint32(b[4*k:]))
				r.LossMask[k] = int8(b[4*nt+k])
				if r.LossMask[k] != 0 {
					r.Masks[k] = r.Tokens[k]
				} else {
					r.Masks[k] = MaskIgnore
				}
			}
		}
		if b, err = take(4); err != nil {
			return fr, err
		}
		nl := int(binary.LittleEndian.Uint32(b))
		if b, err = take(4 * nl); err != nil {
			return fr, err
		}
		if nl > 0 {
			r.Logprobs = make([]float32, nl)
			for k := range nl {
				r.Logprobs[k] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*k:]))
			}
		}
	}
	if len(rest) != 0 {
		return fr, fmt.Errorf("%d bytes after the token columns", len(rest))
	}
	return fr, nil
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// ReadJournal reads every record of a journal file (torn tail dropped and
// logged to log, which may be nil).
func ReadJournal(path string, log *slog.Logger) ([]Record, JournalStats, error) {
	var out []Record
	st, err := readJournal(path, log, func(recs []Record) error {
		out = append(out, recs...)
		return nil
	})
	return out, st, err
}

// pendingJournals lists the journals of dir whose part file does not exist
// (the records not yet compacted), in order, and the highest part number a
// journal reserves (-1 if none).
func pendingJournals(dir string) (pending []string, obsolete []string, maxNum int, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, nil, -1, err
	}
	present := map[string]bool{}
	for _, e := range entries {
		present[e.Name()] = true
	}
	maxNum = -1
	for _, e := range entries {
		m := journalName.FindStringSubmatch(e.Name())
		if m == nil || e.IsDir() {
			continue
		}
		if n, _ := strconv.Atoi(m[1]); n > maxNum {
			maxNum = n
		}
		if present[partOfJournal(e.Name())] {
			obsolete = append(obsolete, e.Name())
		} else {
			pending = append(pending, e.Name())
		}
	}
	return pending, obsolete, maxNum, nil
}

// journalFile is the open journal of the current part file.
type journalFile struct {
	path  string
	f     *os.File
	bytes int64
}

// createJournal creates the journal of partName durably: header written
// and fsynced, directory entry fsynced.
func createJournal(dir, partName string) (*journalFile, error) {
	path := journalPath(dir, partName)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("create journal: %w", err)
	}
	if _, err := io.WriteString(f, journalMagic); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("write journal header %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		os.Remove(path)
		return nil, fmt.Errorf("sync journal %s: %w", path, err)
	}
	if err := syncDir(dir); err != nil {
		f.Close()
		os.Remove(path)
		return nil, err
	}
	return &journalFile{path: path, f: f, bytes: int64(len(journalMagic))}, nil
}
