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
