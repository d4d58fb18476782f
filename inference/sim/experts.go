package sim

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"fmt"
)

// Routed experts (MoE routing replay). Both engines report the routing of
// every position that went through a forward pass in the request: the
// prompt and the sampled ids but the last, which was never fed back —
// (prompt + completion − 1) rows.
//
// vLLM (vllm/entrypoints/serve/disagg/serving.py at 0001948): the choice's
// routed_experts is base64 of a NumPy .npy file of shape
// (positions, layers, topk). SGLang (tokenizer manager, meta_info
// "routed_experts"): base64 of the raw little-endian int32 array of shape
// (positions, layers × topk), no header.

// expertsOf returns the topk distinct experts of one position at one
// layer, deterministic in (position, token id, layer).
func (x *Experts) expertsOf(pos, tok, layer int, out []int32) {
	h := uint64(pos)*0x9e3779b97f4a7c15 ^ uint64(tok)*0xbf58476d1ce4e5b9 ^ uint64(layer)*0x94d049bb133111eb
	for k := 0; k < x.TopK; {
		h ^= h >> 31
		h *= 0xd6e8feb86659fd93
		h ^= h >> 29
		e := int32(h % uint64(x.Num))
		dup := false
		for _, p := range out[:k] {
			if p == e {
				dup = true
				break
			}
		}
		if !dup {
			out[k] = e
			k++
		}
	}
}

// ExpertsFor is the routing the simulator reports for a full sequence
// (prompt then sampled ids): one row of layers × topk experts for each of
// its first len(seq)−1 positions, flat.
func (x *Experts) ExpertsFor(seq []int) []int32 {
	if len(seq) < 2 {
		return nil
	}
	n := len(seq) - 1
	w := x.Layers * x.TopK
	out := make([]int32, n*w)
	for p := 0; p < n; p++ {
		for l := 0; l < x.Layers; l++ {
			off := p*w + l*x.TopK
			x.expertsOf(p, seq[p], l, out[off:off+x.TopK])
		}
	}
	return out
}

// sglangExperts encodes SGLang's meta_info.routed_experts.
func (x *Experts) sglangExperts(seq []int) string {
	flat := x.ExpertsFor(seq)
	b := make([]byte, 4*len(flat))
	for i, v := range flat {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	return base64.StdEncoding.EncodeToString(b)
}

// vllmExperts encodes vLLM's choices[].routed_experts: a version 1.0 .npy
// file of little-endian int32, C order, shape (positions, layers, topk).
func (x *Experts) vllmExperts(seq []int) string {
	flat := x.ExpertsFor(seq)
	n := max(len(seq)-1, 0)
	hdr := fmt.Sprintf("{'descr': '<i4', 'fortran_order': False, 'shape': (%d, %d, %d), }", n, x.Layers, x.TopK)
	// Magic (6) + version (2) + header length (2) + header, padded with
	// spaces to a multiple of 64 and ended by a newline.
	total := 10 + len(hdr) + 1
	pad := (64 - total%64) % 64
	hdr += string(bytes.Repeat([]byte{' '}, pad)) + "\n"
	var buf bytes.Buffer
	buf.WriteString("\x93NUMPY")
	buf.Write([]byte{1, 0})
	var hl [2]byte
	binary.LittleEndian.PutUint16(hl[:], uint16(len(hdr)))
	buf.Write(hl[:])
	buf.WriteString(hdr)
	b := make([]byte, 4*len(flat))
	for i, v := range flat {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
	}
	buf.Write(b)
	return base64.StdEncoding.EncodeToString(buf.Bytes())
}

// versionSpans is SGLang's meta_info.weight_versions for one choice: the
// runs of equal versions over the output ids, each named by its
// weight_version string, end exclusive; no ids: one empty span of the
// current version.
func (h *handler) versionSpans(vers []int64) []map[string]any {
	if len(vers) == 0 {
		return []map[string]any{{"version": h.weightVersionName(), "start": 0, "end": 0}}
	}
	var out []map[string]any
	start := 0
	for i := 1; i <= len(vers); i++ {
		if i == len(vers) || vers[i] != vers[start] {
			out = append(out, map[string]any{"version": h.ctl.versionName(vers[start]), "start": start, "end": i})
			start = i
		}
	}
	return out
}
