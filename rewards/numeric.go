package rewards

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// NumericMatch scores 1 when the number the model gave matches the
// reference within tolerance. The model's number is the content of the last
// \boxed{...} in its final message, else the last number in it.
type NumericMatch struct {
	RelTol float64 // default 1e-6
	AbsTol float64 // default 1e-9
}

var _ Reward = NumericMatch{}

// Score implements Reward.
func (r NumericMatch) Score(_ context.Context, in Input) (Score, error) {
	want, err := ParseNumber(in.Answer)
	if err != nil {
		return Score{}, fmt.Errorf("%w: reference answer %q is not a number: %v", ErrReward, in.Answer, err)
	}
	got, found := ExtractAnswer(in.Final)
	if !found {
		return boolScore(false, map[string]float64{"answer_found": 0}), nil
	}
	g, err := ParseNumber(got)
	if err != nil {
		return boolScore(false, map[string]float64{"answer_found": 0}), nil
	}
	rel, abs := orF(r.RelTol, 1e-6), orF(r.AbsTol, 1e-9)
	ok := math.Abs(g-want) <= math.Max(abs, rel*math.Abs(want))
	return boolScore(ok, map[string]float64{"answer_found": 1}), nil
}

func orF(v, def float64) float64 {
	if v <= 0 {
		return def
	}
	return v
}

// ExtractAnswer returns the content of the last \boxed{...} (balanced
// braces), else the last number in text.
func ExtractAnswer(text string) (string, bool) {
	if i := strings.LastIndex(text, `\boxed{`); i >= 0 {
		start := i + len(`\boxed{`)
		depth := 1
		for j := start; j < len(text); j++ {
			switch text[j] {
			case '{':
				depth++
			case '}':
				depth--
				if depth == 0 {
					return strings.TrimSpace(text[start:j]), true
				}
			}
		}
	}
	return lastNumber(text)
}

func lastNumber(text string) (string, bool) {
	end := -1
	for i := len(text) - 1; i >= 0; i-- {
		if text[i] >= '0' && text[i] <= '9' {
			end = i + 1
			break
		}
	}
	if end < 0 {
		return "", false
	}
	start := end
	for start > 0 {
		c := text[start-1]
		if (c >= '0' && c <= '9') || c == '.' || c == ',' || c == '/' {
			start--
			continue
		}
		if c == '-' && (start == 1 || !isAlnum(text[start-2])) {
			start--
		}
		break
	}
	return strings.Trim(text[start:end], ".,/"), true
}

func isAlnum(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

// ParseNumber reads integers, decimals, thousands separators, simple
// fractions ("3/4"), percentages, \frac{a}{b} and a leading $.
func ParseNumber(s string) (float64, error) {
	s = strings.TrimSpace(s)
	s = strings.TrimPrefix(s, "$")
	s = strings.TrimSuffix(s, "$")
	s = strings.ReplaceAll(s, ",", "")
	s = strings.ReplaceAll(s, `\!`, "")
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, `\frac{`) || strings.HasPrefix(s, `\dfrac{`) {
		body := s[strings.IndexByte(s, '{'):]
		if n, d, ok := splitFrac(body); ok {
			return ratio(n, d)
		}
	}
	if strings.HasSuffix(s, "%") {
		v, err := strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(s, "%")), 64)
		return v / 100, err
	}
	if n, d, ok := strings.Cut(s, "/"); ok {
		return ratio(n, d)
	}
	return strconv.ParseFloat(s, 64)
}

func splitFrac(b string) (string, string, bool) {
	// b = "{n}{d}"
	if !strings.HasPrefix(b, "{") {
		return "", "", false
	}
	i := strings.Index(b, "}{")
	if i < 0 || !strings.HasSuffix(b, "}") {
		return "", "", false
	}
	return b[1:i], b[i+2 : len(b)-1], true
}

func ratio(n, d string) (float64, error) {
	a, err := strconv.ParseFloat(strings.TrimSpace(n), 64)
	if err != nil {
		return 0, err
	}
	b, err := strconv.ParseFloat(strings.TrimSpace(d), 64)
	if err != nil {
		return 0, err
	}
	if b == 0 {
		return 0, fmt.Errorf("division by zero")
	}
	return a / b, nil
}
