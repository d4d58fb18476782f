package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/runner"
)

// Quotas bound what one client may make the server do at once. A client is
// the bearer token it presents (one server token: every client shares one
// quota) or "anonymous" without auth. Exceeding a quota fails StartJob or
// CollectGroups with RESOURCE_EXHAUSTED. Zero values take the defaults;
// negative disables a quota.
type Quotas struct {
	// Jobs: run/eval jobs and collect streams running at once (default 8).
	Jobs int
	// Sandboxes: the sum of limits.sandboxes over a client's running jobs
	// and streams (default 256: 8 jobs at the default 32). A job's own
	// limit is a hard bound enforced by its runner, so the client never
	// holds more containers than this.
	Sandboxes int
	// Rows: rollouts one job may produce, groups × group_size (default
	// 1,000,000). A job with groups 0 counts its items.
	Rows int64
}

func (q Quotas) withDefaults() Quotas {
	if q.Jobs == 0 {
		q.Jobs = 8
	}
	if q.Sandboxes == 0 {
		q.Sandboxes = 256
	}
	if q.Rows == 0 {
		q.Rows = 1_000_000
	}
	return q
}

// quotaBook keeps what every client holds.
type quotaBook struct {
	q    Quotas
	mu   sync.Mutex
	held map[string]*quotaUse
}

type quotaUse struct{ jobs, sandboxes int }

func newQuotaBook(q Quotas) *quotaBook {
	return &quotaBook{q: q.withDefaults(), held: map[string]*quotaUse{}}
}

// clientOf names the caller of an RPC for quotas: a digest of its bearer
// token, never the token itself.
func clientOf(ctx context.Context) string {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if tok, ok := strings.CutPrefix(v, "Bearer "); ok && tok != "" {
			sum := sha256.Sum256([]byte(tok))
			return "token:" + hex.EncodeToString(sum[:6])
		}
	}
	return "anonymous"
}

// reserve takes a job slot and the job's sandboxes for client, checking
// the job's rows; release gives them back (once).
func (b *quotaBook) reserve(client string, sandboxes int, rows int64) (release func(), err error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.held[client]
	if u == nil {
		u = &quotaUse{}
		b.held[client] = u
	}
	switch {
	case b.q.Rows > 0 && rows > b.q.Rows:
		return nil, status.Errorf(codes.ResourceExhausted,
			"quota: this job would produce %d rollouts (groups × group_size), more than the %d a job may (rollout serve --quota-rows); split it", rows, b.q.Rows)
	case b.q.Jobs > 0 && u.jobs+1 > b.q.Jobs:
		return nil, status.Errorf(codes.ResourceExhausted,
			"quota: client %s already runs %d jobs or collect streams, the server allows %d at once (rollout serve --quota-jobs); wait for one to end or cancel one", client, u.jobs, b.q.Jobs)
	case b.q.Sandboxes > 0 && u.sandboxes+sandboxes > b.q.Sandboxes:
		return nil, status.Errorf(codes.ResourceExhausted,
			"quota: limits.sandboxes %d on top of the %d held by client %s's running jobs exceeds the server's %d (rollout serve --quota-sandboxes); lower limits.sandboxes or wait",
			sandboxes, u.sandboxes, client, b.q.Sandboxes)
	}
	u.jobs++
	u.sandboxes += sandboxes
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			u.jobs--
			u.sandboxes -= sandboxes
			if u.jobs == 0 && u.sandboxes == 0 {
				delete(b.held, client)
			}
		})
	}, nil
}

// jobRows is the number of rollouts a job will produce.
func jobRows(ctx context.Context, r *runner.Runner) (int64, error) {
	cfg := r.Config()
	groups := int64(cfg.Groups)
	if groups == 0 {
		items, err := r.Items(ctx)
		if err != nil {
			return 0, err
		}
		groups = int64(len(items))
	}
	return groups * int64(max(cfg.GroupSize, 1)), nil
}

func sandboxesOf(r *runner.Runner) int { return r.Config().Limits.Sandboxes }
