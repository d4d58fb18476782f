package inference

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
)

// What engines report about a generation beyond its ids and logprobs: the
// weight version of every sampled id (SGLang's per-token spans) and the
// mixture-of-experts routing of every position (vLLM and SGLang, routing
// replay). The shapes, and the engine versions they come from, are in
// docs/real-engines.md.

// Routing is the routed experts of the first Positions positions of a
// sequence: Experts[(p*Layers+l)*TopK+k] is the k-th expert position p
// was routed to at layer l.
type Routing struct {
	Experts                 []uint16
	Positions, Layers, TopK int
}

// versionSpan is one checked span of SGLang's meta_info.weight_versions:
// output ids [start, end) were sampled under version v when isInt, else
// under a version that is not an integer (SGLang's initial "default", a
// checkpoint name).
type versionSpan struct {
	start, end int
	v          int64
	isInt      bool
}

// parseVersionSpans checks that SGLang's weight_versions tile the n output
// ids [0, n) in order and decodes each span's version once; the generator
// calls it, so the episode only expands the result (expandVersions).
func parseVersionSpans(spans []SGLangVersionSpan, n int) ([]versionSpan, error) {
	if len(spans) == 0 {
		return nil, nil
	}
	out := make([]versionSpan, 0, len(spans))
	next := 0
	for i, sp := range spans {
		var name any
		if json.Unmarshal(sp.Version, &name) != nil {
			return nil, fmt.Errorf("weight_versions[%d].version is not a JSON value", i)
		}
		if sp.Start != next || sp.End < sp.Start || sp.End > n {
			return nil, fmt.Errorf("weight_versions[%d] covers [%d, %d): want spans tiling the %d output ids from 0 in order", i, sp.Start, sp.End, n)
		}
		v, isInt := parseVersion(name)
		out = append(out, versionSpan{start: sp.Start, end: sp.End, v: v, isInt: isInt})
		next = sp.End
	}
	if next != n {
		return nil, fmt.Errorf("weight_versions end at %d, want %d output ids", next, n)
	}
	return out, nil
}

// expandVersions gives one version per output id from checked spans; a
// span whose version is not an integer gets fallback, the version in
// force when the request was admitted. ok is false when no span names an
// integer (nothing exact to add: the caller stamps).
func expandVersions(spans []versionSpan, n int, fallback int64) (vers []int64, ok bool) {
	for _, sp := range spans {
		ok = ok || sp.isInt
	}
	if !ok {
		return nil, false
	}
	vers = make([]int64, 0, n)
	for _, sp := range spans {
		v := sp.v
		if !sp.isInt {
			v = fallback
		}
		for j := sp.start; j < sp.end; j++ {
			vers = append(vers, v)
		}
	}
	return vers, true
}

// spanVersions is parseVersionSpans then expandVersions: one version per
// output id, ok false when no span names an integer, an error when the
// spans do not tile [0, n) exactly.
func spanVersions(spans []SGLangVersionSpan, n int, fallback int64) (vers []int64, ok bool, err error) {
	ps, err := parseVersionSpans(spans, n)
	if err != nil {
		return nil, false, err
	}
	vers, ok = expandVersions(ps, n, fallback)
	return vers, ok, nil
}

// decodeSGLangExperts reads SGLang's meta_info.routed_experts: base64 of a
// little-endian int32 array of positions rows, each layers × topk wide.
func decodeSGLangExperts(b64 string, positions, topk int) (*Routing, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("routed_experts is not base64: %w", err)
	}
	if len(raw)%4 != 0 {
		return nil, fmt.Errorf("routed_experts has %d bytes, not a whole number of int32", len(raw))
	}
	n := len(raw) / 4
	if positions <= 0 {
		if n != 0 {
			return nil, fmt.Errorf("routed_experts has %d ids for no position", n)
		}
		return &Routing{TopK: topk}, nil
	}
	if n%positions != 0 || (n/positions)%topk != 0 || n == 0 {
		return nil, fmt.Errorf("routed_experts has %d ids: not %d positions × layers × top-k %d", n, positions, topk)
	}
	r := &Routing{Experts: make([]uint16, n), Positions: positions, Layers: n / positions / topk, TopK: topk}
	for i := range n {
		v := int32(binary.LittleEndian.Uint32(raw[4*i:]))
		if v < 0 || v > math.MaxUint16 {
			return nil, fmt.Errorf("routed_experts[%d] = %d: not an expert id", i, v)
		}
		r.Experts[i] = uint16(v)
	}
	return r, nil
}

var npyShape = regexp.MustCompile(`'shape':\s*\(([^)]*)\)`)
var npyDescr = regexp.MustCompile(`'descr':\s*'([^']*)'`)

// decodeNPYExperts reads vLLM's choices[].routed_experts: base64 of a .npy
// file holding an integer array of shape (positions, layers, topk), C
// order.
func decodeNPYExperts(b64 string) (*Routing, error) {
	raw, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("routed_experts is not base64: %w", err)
	}
	if len(raw) < 10 || !bytes.HasPrefix(raw, []byte("\x93NUMPY")) {
		return nil, fmt.Errorf("routed_experts is not a .npy array")
	}
	var hlen, off int
	switch raw[6] {
	case 1:
		hlen, off = int(binary.LittleEndian.Uint16(raw[8:10])), 10
	case 2, 3:
		if len(raw) < 12 {
			return nil, fmt.Errorf("routed_experts: truncated .npy header")
		}
		hlen, off = int(binary.LittleEndian.Uint32(raw[8:12])), 12
	default:
		return nil, fmt.Errorf("routed_experts: .npy version %d.%d", raw[6], raw[7])
	}
	if off+hlen > len(raw) {
		return nil, fmt.Errorf("routed_experts: truncated .npy header")
	}
	hdr := string(raw[off : off+hlen])
	data := raw[off+hlen:]
	if strings.Contains(hdr, "'fortran_order': True") {
		return nil, fmt.Errorf("routed_experts: Fortran-order .npy arrays are not read")
	}
	dm := npyDescr.FindStringSubmatch(hdr)
	sm := npyShape.FindStringSubmatch(hdr)
	if dm == nil || sm == nil {
		return nil, fmt.Errorf("routed_experts: .npy header without descr or shape: %q", hdr)
	}
	var dims []int
	for _, f := range strings.Split(sm[1], ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := strconv.Atoi(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("routed_experts: .npy shape %q", sm[1])
		}
		dims = append(dims, d)
	}
	if len(dims) != 3 {
		return nil, fmt.Errorf("routed_experts: .npy shape (%s), want (positions, layers, topk)", sm[1])
	}
	var size int
	var order binary.ByteOrder = binary.LittleEndian
	d := dm[1]
	if strings.HasPrefix(d, ">") {
		order = binary.BigEndian
	}
	signed := strings.Contains(d, "i")
	switch d[len(d)-1] {
	case '1', '2', '4', '8':
		size = int(d[len(d)-1] - '0')
	}
	if size == 0 || !(signed || strings.Contains(d, "u")) {
		return nil, fmt.Errorf("routed_experts: .npy dtype %q is not an integer type", d)
	}
	n := dims[0] * dims[1] * dims[2]
	if len(data) != n*size {
		return nil, fmt.Errorf("routed_experts: %d data bytes for shape (%d, %d, %d) of %s", len(data), dims[0], dims[1], dims[2], d)
	}
	r := &Routing{Experts: make([]uint16, n), Positions: dims[0], Layers: dims[1], TopK: dims[2]}
	for i := range n {
		b := data[i*size:]
		var v int64
		switch size {
		case 1:
			v = int64(b[0])
			if signed {
				v = int64(int8(b[0]))
			}
		case 2:
			v = int64(order.Uint16(b))
			if signed {
				v = int64(int16(order.Uint16(b)))
			}
		case 4:
			v = int64(order.Uint32(b))
			if signed {
				v = int64(int32(order.Uint32(b)))
			}
		case 8:
			v = int64(order.Uint64(b))
		}
		if v < 0 || v > math.MaxUint16 {
			return nil, fmt.Errorf("routed_experts[%d] = %d: not an expert id", i, v)
		}
		r.Experts[i] = uint16(v)
	}
	return r, nil
}
