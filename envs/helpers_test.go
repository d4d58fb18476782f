package envs

import (
	"bytes"
	"compress/gzip"
	"encoding/base64"
	"testing"
)

func base64Std(b []byte) string { return base64.StdEncoding.EncodeToString(b) }

// b64 packs files as a base64 tar.gz, the TB2 row encoding.
func b64(t *testing.T, files map[string]string) string {
	t.Helper()
	raw, err := tarOf(files, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(raw)
	_ = zw.Close()
	return base64Std(gz.Bytes())
}
