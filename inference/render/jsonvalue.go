package render

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/ardanlabs/jinja"
)

// jsonParser decodes one JSON document straight into ordered jinja values:
// objects keep their key order, numbers keep their integer/float kind.
// It is several times faster than encoding/json's token stream, which
// dominated Apply's time.
type jsonParser struct {
	c    *converter
	data []byte
	pos  int
}

func (p *jsonParser) errf(format string, args ...any) error {
	return fmt.Errorf("JSON at offset %d: %s", p.pos, fmt.Sprintf(format, args...))
}

func (p *jsonParser) skipSpace() {
	for p.pos < len(p.data) {
		switch p.data[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func (p *jsonParser) value(depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Value{}, errors.New("JSON nested too deeply")
	}
	p.skipSpace()
	if p.pos >= len(p.data) {
		return jinja.Value{}, p.errf("unexpected end")
	}
	switch ch := p.data[p.pos]; {
	case ch == '{':
		return p.object(depth)
	case ch == '[':
		return p.array(depth)
	case ch == '"':
		s, err := p.str()
		if err != nil {
			return jinja.Value{}, err
		}
		return p.c.str(s)
	case ch == '-' || (ch >= '0' && ch <= '9'):
		return p.number()
	default:
		return p.literal()
	}
}

func (p *jsonParser) literal() (jinja.Value, error) {
	for _, l := range [...]struct {
		text string
		v    jinja.Value
	}{{"true", jinja.NewBool(true)}, {"false", jinja.NewBool(false)}, {"null", jinja.None()}} {
		if len(p.data)-p.pos >= len(l.text) && string(p.data[p.pos:p.pos+len(l.text)]) == l.text {
			p.pos += len(l.text)
			return l.v, nil
		}
	}
	return jinja.Value{}, p.errf("invalid character %q", p.data[p.pos])
}

func (p *jsonParser) number() (jinja.Value, error) {
	start := p.pos
	for p.pos < len(p.data) {
		ch := p.data[p.pos]
		if (ch >= '0' && ch <= '9') || ch == '-' || ch == '+' || ch == '.' || ch == 'e' || ch == 'E' {
			p.pos++
			continue
		}
		break
	}
	text := string(p.data[start:p.pos])
	if !json.Valid(p.data[start:p.pos]) {
		return jinja.Value{}, p.errf("invalid number %q", text)
	}
	return p.c.number(text)
}

// str reads a JSON string; escapes are decoded by encoding/json.
func (p *jsonParser) str() (string, error) {
	start := p.pos
	p.pos++
	escaped := false
	for p.pos < len(p.data) {
		switch ch := p.data[p.pos]; {
		case ch == '\\':
			escaped = true
			p.pos += 2
			continue
		case ch == '"':
			p.pos++
			raw := p.data[start:p.pos]
			if !escaped {
				s := string(raw[1 : len(raw)-1])
				if !validPlain(s) {
					return "", p.errf("invalid string")
				}
				return s, nil
			}
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", p.errf("invalid string: %v", err)
			}
			return s, nil
		case ch < 0x20:
			return "", p.errf("control character in string")
		}
		p.pos++
	}
	return "", p.errf("unterminated string")
}

// validPlain reports whether an escape-free string is valid UTF-8 (JSON
// text must be; encoding/json would replace bad bytes with U+FFFD).
func validPlain(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return jsonValidUTF8(s)
		}
	}
	return true
}

func (p *jsonParser) expect(ch byte) bool {
	p.skipSpace()
	if p.pos < len(p.data) && p.data[p.pos] == ch {
		p.pos++
		return true
	}
	return false
}

func (p *jsonParser) array(depth int) (jinja.Value, error) {
	p.pos++ // [
	items := []jinja.Value{}
	if p.expect(']') {
		return jinja.NewList(items), nil
	}
	for {
		v, err := p.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		items = append(items, v)
		if p.expect(',') {
			continue
		}
		if p.expect(']') {
			return jinja.NewList(items), nil
		}
		return jinja.Value{}, p.errf("expected , or ]")
	}
}

func (p *jsonParser) object(depth int) (jinja.Value, error) {
	p.pos++ // {
	v := jinja.NewDict()
	d := v.AsDict()
	if p.expect('}') {
		return v, nil
	}
	for {
		p.skipSpace()
		if p.pos >= len(p.data) || p.data[p.pos] != '"' {
			return jinja.Value{}, p.errf("expected a key")
		}
		key, err := p.str()
		if err != nil {
			return jinja.Value{}, err
		}
		kv, err := p.c.str(key)
		if err != nil {
			return jinja.Value{}, err
		}
		if !p.expect(':') {
			return jinja.Value{}, p.errf("expected :")
		}
		val, err := p.value(depth + 1)
		if err != nil {
			return jinja.Value{}, err
		}
		d.Set(kv.AsString(), val)
		if p.expect(',') {
			continue
		}
		if p.expect('}') {
			return v, nil
		}
		return jinja.Value{}, p.errf("expected , or }")
	}
}
