package jsonscan

import (
	"errors"
	"testing"
)

func TestValueEnd(t *testing.T) {
	for _, c := range []struct {
		in   string
		end  int
		fail error
	}{
		{`"a\"b",`, 6, nil},
		{`"a\\",1`, 5, nil},
		{`"a\\\"b"`, 8, nil},
		{`"\\\\"x`, 6, nil},
		{`"a\"`, 0, ErrUnterminatedString},
		{`[1,[2,{"x":"]"}]],3`, 17, nil},
		{`{"a":1}}`, 7, nil},
		{`123,`, 3, nil},
		{`true}`, 4, nil},
		{`null`, 4, nil},
		{`-1.5e3 `, 6, nil},
		{`"abc`, 0, ErrUnterminatedString},
		{`[1,2`, 0, ErrUnterminatedValue},
		{`{"a":[}`, 0, ErrUnterminatedValue},
	} {
		end, err := ValueEnd([]byte(c.in), 0)
		if !errors.Is(err, c.fail) || err == nil && end != c.end {
			t.Errorf("ValueEnd(%s) = %d, %v; want %d, %v", c.in, end, err, c.end, c.fail)
		}
	}
	if got := SkipWS([]byte(" \t\r\n x"), 0); got != 5 {
		t.Errorf("SkipWS = %d, want 5", got)
	}
}

// refValueEnd is ValueEnd walking strings byte by byte.
func refValueEnd(b []byte, i int) (int, error) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			i++
			for i < len(b) && b[i] != '"' {
				if b[i] == '\\' {
					i++
				}
				i++
			}
			if i >= len(b) {
				return 0, ErrUnterminatedString
			}
			i++
		case '[', '{':
			depth++
			i++
			continue
		case ']', '}':
			if depth == 0 {
				return i, nil
			}
			depth--
			i++
		case ',', ':', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, nil
			}
			i++
			continue
		default:
			i++
			continue
		}
		if depth == 0 {
			return i, nil
		}
	}
	if depth != 0 {
		return 0, ErrUnterminatedValue
	}
	return i, nil
}

func FuzzValueEnd(f *testing.F) {
	for _, s := range []string{`"a\"b",`, `"a\\",1`, `[1,"\\\"",{"k":"v\\"}],`, `"\`, `{"a":[1,2]}x`, `"x\\\\\"y"`} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, gerr := ValueEnd([]byte(s), 0)
		want, werr := refValueEnd([]byte(s), 0)
		if got != want || !errors.Is(gerr, werr) && (gerr != nil || werr != nil) {
			t.Fatalf("ValueEnd(%q) = %d, %v; the byte-by-byte walk gives %d, %v", s, got, gerr, want, werr)
		}
	})
}
