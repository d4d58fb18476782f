package render

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"testing"
)

// RewriteGGUF copies the GGUF file src to dst with the metadata entries
// in set replaced or added (values as ggufBytes takes them), the other
// entries and the tensors byte for byte: a model llama.cpp still loads,
// with another tokenizer.
func RewriteGGUF(t testing.TB, src, dst string, set map[string]any) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	out, err := rewriteGGUF(t, data, set)
	if err != nil {
		t.Fatalf("rewrite %s: %v", src, err)
	}
	if err := os.WriteFile(dst, out, 0o644); err != nil {
		t.Fatal(err)
	}
}

func rewriteGGUF(t testing.TB, data []byte, set map[string]any) ([]byte, error) {
	g := &ggufReader{r: bufio.NewReader(bytes.NewReader(data)), left: int64(len(data))}
	pos := func() int { return len(data) - int(g.left) }
	if _, err := g.fixed(8); err != nil { // magic, version
		return nil, err
	}
	nTensors, err := g.u64()
	if err != nil {
		return nil, err
	}
	nKV, err := g.u64()
	if err != nil {
		return nil, err
	}
	var kvs bytes.Buffer
	kept, alignment := 0, uint64(32)
	for range nKV {
		start := pos()
		key, err := g.str()
		if err != nil {
			return nil, err
		}
		typ, err := g.u32()
		if err != nil {
			return nil, err
		}
		v, err := g.value(typ, 0)
		if err != nil {
			return nil, err
		}
		if key == "general.alignment" {
			if a, ok := v.(uint64); ok && a > 0 {
				alignment = a
			}
		}
		if _, replaced := set[key]; !replaced {
			kvs.Write(data[start:pos()])
			kept++
		}
	}
	for k, v := range set {
		writeGGUFString(&kvs, k)
		writeGGUFValue(t, &kvs, v, true)
	}
	infoStart := pos()
	for range nTensors {
		if err := skipTensorInfo(g); err != nil {
			return nil, err
		}
	}
	infoEnd := pos()
	dataStart := (uint64(infoEnd) + alignment - 1) / alignment * alignment

	var out bytes.Buffer
	out.Write(data[:8])
	_ = binary.Write(&out, binary.LittleEndian, nTensors)
	_ = binary.Write(&out, binary.LittleEndian, uint64(kept+len(set)))
	out.Write(kvs.Bytes())
	out.Write(data[infoStart:infoEnd])
	for uint64(out.Len())%alignment != 0 {
		out.WriteByte(0)
	}
	out.Write(data[dataStart:])
	return out.Bytes(), nil
}

// skipTensorInfo reads one tensor info: name, dimension count, dimensions,
// type, offset.
func skipTensorInfo(g *ggufReader) error {
	if _, err := g.str(); err != nil {
		return err
	}
	nDims, err := g.u32()
	if err != nil {
		return err
	}
	if nDims > 8 {
		return fmt.Errorf("tensor with %d dimensions", nDims)
	}
	for range nDims {
		if _, err := g.u64(); err != nil {
			return err
		}
	}
	if _, err := g.u32(); err != nil {
		return err
	}
	_, err = g.u64()
	return err
}
