package openenv

import (
	"errors"
	"testing"

	"github.com/rollout-rl/rollout/envs/protocol"
)

// FuzzParseReply: any server message is an observation, a model-side
// failure, or an error of the protocol's classes; never a panic.
func FuzzParseReply(f *testing.F) {
	for _, s := range []string{
		`{"type":"observation","data":{"observation":{"text":"hi"},"reward":0.5,"done":false}}`,
		`{"type":"observation","data":{"observation":{},"reward":null,"done":true}}`,
		`{"type":"error","data":{"message":"bad","code":"VALIDATION_ERROR","errors":[{"loc":["x"]}]}}`,
		`{"type":"error","data":{"message":"full","code":"CAPACITY_REACHED"}}`,
		`{"type":"state","data":{}}`, `{"type":"observation","data":[]}`, `not json`, `{}`, `null`,
	} {
		f.Add([]byte(s))
	}
	ep := protocol.Endpoint{Name: "fuzz"}
	f.Fuzz(func(t *testing.T, b []byte) {
		obs, err := parseReply(ep, b)
		if err != nil {
			if !errors.Is(err, protocol.ErrViolation) && !errors.Is(err, protocol.ErrUnreachable) {
				t.Fatalf("error of no protocol class: %v", err)
			}
			return
		}
		if !obs.failed && obs.obs == nil {
			t.Fatalf("observation without its object: %+v", obs)
		}
	})
}
