package docker

import (
	"encoding/binary"
	"fmt"
	"io"
)

// demuxReader reads Docker's multiplexed attach stream (8-byte headers:
// stream, 3 zero bytes, big-endian length) in the caller's goroutine: it
// returns the stdout payload and copies stderr frames to stderr. It replaces
// a stdcopy goroutine feeding an io.Pipe, which cost every frame from the
// agent one goroutine hand-off on the exec round trip.
type demuxReader struct {
	r      io.Reader
	stderr io.Writer
	left   int // stdout bytes left in the current frame
	hdr    [8]byte
}

func (d *demuxReader) Read(p []byte) (int, error) {
	for d.left == 0 {
		if _, err := io.ReadFull(d.r, d.hdr[:]); err != nil {
			return 0, err
		}
		n := int(binary.BigEndian.Uint32(d.hdr[4:]))
		switch d.hdr[0] {
		case 0, 1: // stdin (never sent) and stdout
			d.left = n
		case 2:
			if _, err := io.CopyN(d.stderr, d.r, int64(n)); err != nil {
				return 0, err
			}
		case 3:
			msg := make([]byte, min(n, 4096))
			_, _ = io.ReadFull(d.r, msg)
			return 0, fmt.Errorf("docker attach stream error: %s", msg)
		default:
			return 0, fmt.Errorf("docker attach stream: unknown stream id %d", d.hdr[0])
		}
	}
	if len(p) > d.left {
		p = p[:d.left]
	}
	n, err := d.r.Read(p)
	d.left -= n
	if err == io.EOF && d.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}
