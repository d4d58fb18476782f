package atropos

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Paths of the Atropos trajectory API (atroposlib/api/server.py).
const (
	pathRegisterEnv    = "/register-env"
	pathDisconnectEnv  = "/disconnect-env"
	pathInfo           = "/info"
	pathStatusEnv      = "/status-env"
	pathScoredData     = "/scored_data"
	pathScoredDataList = "/scored_data_list"
)

// statusWaitForTrainer is /register-env's answer until the trainer's first
// GET /batch.
const statusWaitForTrainer = "wait for trainer to start"

// Registration is the API's answer to POST /register-env.
type Registration struct {
	Status             string `json:"status"`
	EnvID              int    `json:"env_id"`
	WandbName          string `json:"wandb_name"`
	CheckpointDir      string `json:"checkpoint_dir"`
	StartingStep       int    `json:"starting_step"`
	CheckpointInterval int    `json:"checkpoint_interval"`
	NumSteps           int    `json:"num_steps"`
}

// Info is GET /info: the trainer's batch size (sequences) and maximum
// sequence length; -1 before the trainer registered.
type Info struct {
	BatchSize   int `json:"batch_size"`
	MaxTokenLen int `json:"max_token_len"`
}

// EnvStatus is GET /status-env. QueueSize counts queued groups (this env's
// sequences plus what other envs can pack, divided by this env's group
// size); CurrentStep counts batches the API has formed.
type EnvStatus struct {
	CurrentStep         int     `json:"current_step"`
	QueueSize           int     `json:"queue_size"`
	UnallocatedFraction float64 `json:"unallocated_fraction"`
	SelfQueueSize       int     `json:"self_queue_size"`
	MaxGroupSize        int     `json:"max_group_size"`
	EnvWeight           float64 `json:"env_weight"`
}

type registerEnvRequest struct {
	MaxTokenLength     int      `json:"max_token_length"`
	DesiredName        string   `json:"desired_name"`
	Weight             float64  `json:"weight"`
	GroupSize          int      `json:"group_size"`
	MinBatchAllocation *float64 `json:"min_batch_allocation"`
}

type envIdentifier struct {
	EnvID int `json:"env_id"`
}

// scoredReply is the answer of /scored_data and /scored_data_list.
type scoredReply struct {
	Status          string `json:"status"`
	BufferSize      *int   `json:"buffer_size,omitempty"`
	GroupsProcessed *int   `json:"groups_processed,omitempty"`
}

// APIError is a non-2xx answer of the API. errors.Is(err, ErrRejected)
// holds for the statuses that retrying cannot fix.
type APIError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *APIError) Error() string {
	body := strings.TrimSpace(e.Body)
	if len(body) > 512 {
		body = body[:512] + "…"
	}
	if body == "" {
		return fmt.Sprintf("%s %s: HTTP %d", e.Method, e.Path, e.Status)
	}
	return fmt.Sprintf("%s %s: HTTP %d: %s", e.Method, e.Path, e.Status, body)
}

// Is makes permanent client errors match ErrRejected.
func (e *APIError) Is(target error) bool { return target == ErrRejected && permanent(e.Status) }

// permanent reports a 4xx that a retry would only repeat. 408 and 429 are
// transient; 404, 409 and 410 may mean the API forgot this env (a restart
// of a stricter re-implementation), which re-registration fixes.
func permanent(status int) bool {
	switch status {
	case http.StatusRequestTimeout, http.StatusTooManyRequests, http.StatusNotFound, http.StatusConflict, http.StatusGone:
		return false
	}
	return status >= 400 && status < 500
}

// unknownEnv reports an answer that may mean the API no longer knows the
// env: Atropos raises IndexError (HTTP 500) for an unknown env_id on
// /status-env; a stricter server may say 404/409/410/422.
func unknownEnv(err error) bool {
	var ae *APIError
	if !errors.As(err, &ae) {
		return false
	}
	switch ae.Status {
	case http.StatusNotFound, http.StatusConflict, http.StatusGone, http.StatusUnprocessableEntity:
		return true
	}
	return ae.Status >= 500
}

// client speaks the run-api protocol.
type client struct {
	base    string
	hc      *http.Client
	timeout time.Duration
}

// do sends one request. body may be sent with any method: /status-env is a
// GET with a JSON body. A gzip'd body carries Content-Encoding: gzip.
func (c *client) do(ctx context.Context, method, path string, body []byte, gzipped bool, out any) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if gzipped {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return fmt.Errorf("%s %s: %w", method, path, err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return fmt.Errorf("%s %s: read response: %w", method, path, err)
	}
	if resp.StatusCode/100 != 2 {
		return &APIError{Method: method, Path: path, Status: resp.StatusCode, Body: string(data)}
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("%s %s: decode response %q: %w", method, path, truncate(data, 200), err)
	}
	return nil
}

func (c *client) registerEnv(ctx context.Context, req registerEnvRequest) (Registration, error) {
	var out Registration
	body, _ := json.Marshal(req)
	err := c.do(ctx, http.MethodPost, pathRegisterEnv, body, false, &out)
	return out, err
}

func (c *client) info(ctx context.Context) (Info, error) {
	var out Info
	err := c.do(ctx, http.MethodGet, pathInfo, nil, false, &out)
	return out, err
}

func (c *client) statusEnv(ctx context.Context, envID int) (EnvStatus, error) {
	var out EnvStatus
	body, _ := json.Marshal(envIdentifier{EnvID: envID})
	err := c.do(ctx, http.MethodGet, pathStatusEnv, body, false, &out)
	return out, err
}

func (c *client) disconnectEnv(ctx context.Context, envID int) error {
	var out struct {
		Status string `json:"status"`
		Error  string `json:"error"`
	}
	body, _ := json.Marshal(envIdentifier{EnvID: envID})
	if err := c.do(ctx, http.MethodPost, pathDisconnectEnv, body, false, &out); err != nil {
		return err
	}
	if out.Status != "success" {
		return fmt.Errorf("POST %s: status %q: %s", pathDisconnectEnv, out.Status, out.Error)
	}
	return nil
}

// postScored sends an already gzip'd /scored_data or /scored_data_list body.
func (c *client) postScored(ctx context.Context, path string, gz []byte) (scoredReply, error) {
	var out scoredReply
	err := c.do(ctx, http.MethodPost, path, gz, true, &out)
	return out, err
}

// withEnvID returns the group object with "env_id" prepended. Spooled groups
// never carry one: it is assigned by the registration current at send time.
func withEnvID(group json.RawMessage, envID int) ([]byte, error) {
	g := bytes.TrimSpace(group)
	if len(g) < 2 || g[0] != '{' || g[len(g)-1] != '}' {
		return nil, fmt.Errorf("spooled group is not a JSON object")
	}
	out := make([]byte, 0, len(g)+24)
	out = append(out, `{"env_id":`...)
	out = strconv.AppendInt(out, int64(envID), 10)
	if inner := bytes.TrimSpace(g[1 : len(g)-1]); len(inner) > 0 {
		out = append(out, ',')
		out = append(out, inner...)
	}
	return append(out, '}'), nil
}

// scoredBody builds the gzip'd body for one group (/scored_data) or several
// (/scored_data_list).
func scoredBody(groups []json.RawMessage, envID int, list bool) ([]byte, error) {
	var raw bytes.Buffer
	if list {
		raw.WriteByte('[')
	}
	for i, g := range groups {
		b, err := withEnvID(g, envID)
		if err != nil {
			return nil, err
		}
		if i > 0 {
			raw.WriteByte(',')
		}
		raw.Write(b)
	}
	if list {
		raw.WriteByte(']')
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, fmt.Errorf("gzip body: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip body: %w", err)
	}
	return gz.Bytes(), nil
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}
