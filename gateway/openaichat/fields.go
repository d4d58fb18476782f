package openaichat

import (
	"bytes"

	json "github.com/segmentio/encoding/json"

	"github.com/rollout-rl/rollout/internal/util/jsonscan"
)

// topFields gives what decoding body into a map[string]json.RawMessage
// gives for the keys decode reads raw ("tools" and the recorded ones;
// nil when there are none), without decoding the rest of the body into a
// map: once json.Valid has checked the body, its top-level members are
// found by structure alone.
// ok false (not a valid JSON object): decode the map to know, and to
// have the codec's error.
func topFields(body []byte) (fields map[string]json.RawMessage, ok bool) {
	i := jsonscan.SkipWS(body, 0)
	if i >= len(body) || body[i] != '{' || !json.Valid(body) {
		return nil, false
	}
	i = jsonscan.SkipWS(body, i+1)
	if body[i] == '}' {
		return nil, true
	}
	for {
		kend := stringEnd(body, i)
		key := body[i+1 : kend-1]
		name, unescaped := "", false
		if bytes.IndexByte(key, '\\') >= 0 {
			// What the map's key would be.
			if json.Unmarshal(body[i:kend], &name) != nil {
				return nil, false
			}
			unescaped = true
		}
		i = jsonscan.SkipWS(body, jsonscan.SkipWS(body, kend)+1) // past ':'
		end := valueEnd(body, i)
		if !unescaped && keptKey(key) {
			name = string(key)
		}
		if keptKey([]byte(name)) {
			if fields == nil {
				fields = make(map[string]json.RawMessage, 4)
			}
			// A copy, as the codec's json.RawMessage; the last of
			// duplicate keys wins, as in a map.
			fields[name] = append(json.RawMessage(nil), body[i:end]...)
		}
		i = jsonscan.SkipWS(body, end)
		if body[i] == '}' {
			return fields, true
		}
		i = jsonscan.SkipWS(body, i+1) // past ','
	}
}

// keptKey reports whether decode reads the member k raw: "tools" or
// one of recorded.
func keptKey(k []byte) bool {
	if string(k) == "tools" {
		return true
	}
	for _, r := range recorded {
		if string(k) == r {
			return true
		}
	}
	return false
}

// stringEnd is the offset just past the valid JSON string at b[i:].
func stringEnd(b []byte, i int) int {
	for i++; ; i++ {
		j := bytes.IndexByte(b[i:], '"')
		i += j
		// An escaped quote has an odd run of backslashes before it.
		k := i
		for k > 0 && b[k-1] == '\\' {
			k--
		}
		if (i-k)%2 == 0 {
			return i + 1
		}
	}
}

// valueEnd is the offset just past the valid JSON value at b[i:].
func valueEnd(b []byte, i int) int {
	end, _ := jsonscan.ValueEnd(b, i) // the body is valid JSON (json.Valid)
	return end
}

// arrayElems are the elements of the JSON array raw (already checked by
// the codec), found by structure; ok is false when raw is not an array.
func arrayElems(raw []byte) (elems [][]byte, ok bool) {
	i := jsonscan.SkipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, false
	}
	i = jsonscan.SkipWS(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return nil, true
	}
	for i < len(raw) {
		end, err := jsonscan.ValueEnd(raw, i)
		if err != nil {
			return nil, false
		}
		elems = append(elems, raw[i:end])
		i = jsonscan.SkipWS(raw, end)
		switch {
		case i >= len(raw):
			return nil, false
		case raw[i] == ']':
			return elems, true
		case raw[i] != ',':
			return nil, false
		}
		i = jsonscan.SkipWS(raw, i+1)
	}
	return nil, false
}
