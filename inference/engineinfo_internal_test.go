package inference

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

func npy(descr string, shape string, data []byte) string {
	hdr := fmt.Sprintf("{'descr': '%s', 'fortran_order': False, 'shape': %s, }\n", descr, shape)
	b := append([]byte("\x93NUMPY\x01\x00"), byte(len(hdr)), byte(len(hdr)>>8))
	b = append(append(b, hdr...), data...)
	return base64.StdEncoding.EncodeToString(b)
}

func TestDecodeNPYExperts(t *testing.T) {
	be := make([]byte, 8)
	for i, v := range []uint16{1, 2, 3, 4} {
		binary.BigEndian.PutUint16(be[2*i:], v)
	}
	for _, tc := range []struct{ name, b64, err string }{
		{"u1", npy("|u1", "(2, 1, 2)", []byte{1, 2, 3, 4}), ""},
		{"i2 big-endian", npy(">i2", "(2, 1, 2)", be), ""},
		{"i8", npy("<i8", "(1, 2, 2)", []byte{1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0}), ""},
		{"float", npy("<f4", "(1, 1, 1)", []byte{0, 0, 128, 63}), "not an integer"},
		{"short", npy("|u1", "(2, 1, 2)", []byte{1, 2, 3}), "3 data bytes"},
		{"2-d", npy("|u1", "(2, 2)", []byte{1, 2, 3, 4}), "want (positions, layers, topk)"},
		{"negative", npy("|i1", "(1, 1, 1)", []byte{0xff}), "not an expert id"},
		{"not npy", base64.StdEncoding.EncodeToString([]byte("hello world")), "not a .npy"},
		{"not base64", "%%%", "not base64"},
	} {
		r, err := decodeNPYExperts(tc.b64)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Fatalf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.Equal(r.Experts, []uint16{1, 2, 3, 4}) {
			t.Fatalf("%s: experts %v (%d×%d×%d)", tc.name, r.Experts, r.Positions, r.Layers, r.TopK)
		}
	}
}

func TestDecodeSGLangExperts(t *testing.T) {
	raw := make([]byte, 4*12)
	for i := range 12 {
		binary.LittleEndian.PutUint32(raw[4*i:], uint32(i))
	}
	b64 := base64.StdEncoding.EncodeToString(raw)
	r, err := decodeSGLangExperts(b64, 3, 2)
	if err != nil || r.Layers != 2 || r.Positions != 3 || r.Experts[11] != 11 {
		t.Fatalf("%+v %v", r, err)
	}
	if _, err := decodeSGLangExperts(b64, 5, 2); err == nil {
		t.Fatal("12 ids read as 5 positions")
	}
	if _, err := decodeSGLangExperts(b64, 3, 5); err == nil {
		t.Fatal("rows of 4 read with top-k 5")
	}
}

func TestSpanVersions(t *testing.T) {
	sp := func(s string) []SGLangVersionSpan {
		var out []SGLangVersionSpan
		if err := json.Unmarshal([]byte(s), &out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	v, ok, err := spanVersions(sp(`[{"version":"default","start":0,"end":2},{"version":"7","start":2,"end":3}]`), 3, 4)
	if err != nil || !ok || !slices.Equal(v, []int64{4, 4, 7}) {
		t.Fatalf("%v %v %v", v, ok, err)
	}
	if _, ok, err := spanVersions(sp(`[{"version":"default","start":0,"end":3}]`), 3, 4); ok || err != nil {
		t.Fatalf("only a name: ok %v err %v", ok, err)
	}
	for _, bad := range []string{
		`[{"version":"1","start":0,"end":2}]`,
		`[{"version":"1","start":1,"end":3}]`,
		`[{"version":"1","start":0,"end":2},{"version":"2","start":1,"end":3}]`,
		`[{"version":"1","start":0,"end":4}]`,
	} {
		if _, _, err := spanVersions(sp(bad), 3, 0); err == nil {
			t.Fatalf("%s accepted", bad)
		}
	}
}
