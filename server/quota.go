package server

import (
	"context"
	"strings"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/runner"
)

// Quotas bound what one tenant may make the server do at once. A tenant
// is a named client with its own bearer token (tenant.go); the single
// --auth-token-file token is one tenant, and a server without auth has one
// anonymous tenant. Exceeding a quota fails StartJob or CollectGroups with
// RESOURCE_EXHAUSTED. Zero values take the defaults; negative disables a
// quota.
type Quotas struct {
	// Jobs: run/eval jobs and collect streams running at once (default 8).
	Jobs int
	// Sandboxes: the sum of limits.sandboxes over a tenant's running jobs
	// and streams (default 256: 8 jobs at the default 32). A job's own
	// limit is a hard bound enforced by its runner, so the tenant never
	// holds more containers than this.
	Sandboxes int
	// Rows: rollouts one job or one CollectGroups stream may produce,
	// groups × group_size (default 1,000,000). A job with groups 0 counts
	// its items; a stream counts the groups it starts.
	Rows int64
	// Sessions: gateway sessions open at once (`rollout gateway` only,
	// from opening until closed or expired; 0: no bound of the tenant's
	// own, --max-sessions bounds all tenants together).
	Sessions int
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

// over fills q's zero fields from def.
func (q Quotas) over(def Quotas) Quotas {
	if q.Jobs == 0 {
		q.Jobs = def.Jobs
	}
	if q.Sandboxes == 0 {
		q.Sandboxes = def.Sandboxes
	}
	if q.Rows == 0 {
		q.Rows = def.Rows
	}
	return q.withDefaults()
}

// quotaBook keeps what every tenant holds.
type quotaBook struct {
	def    Quotas
	tenant map[string]Quotas // tenants with quotas of their own
	mu     sync.Mutex
	held   map[string]*quotaUse
}

type quotaUse struct{ jobs, sandboxes int }

func newQuotaBook(def Quotas, tenants []Tenant) *quotaBook {
	b := &quotaBook{def: def.withDefaults(), tenant: map[string]Quotas{}, held: map[string]*quotaUse{}}
	for _, t := range tenants {
		b.tenant[t.Name] = t.Quotas.over(def)
	}
	return b
}

// of is the quotas of tenant.
func (b *quotaBook) of(tenant string) Quotas {
	if q, ok := b.tenant[tenant]; ok {
		return q
	}
	return b.def
}

// rowsExceeded is the error of a job or stream past tenant's rows quota.
func rowsExceeded(tenant, what string, rows, limit int64) error {
	metricTenantRejected.WithLabelValues(tenantLabel(tenant), "rows").Inc()
	return status.Errorf(codes.ResourceExhausted,
		"quota: %s would produce %d rollouts (groups × group_size), more than the %d tenant %s may per job or stream (rollout serve --quota-rows, or the tenant's quotas.rows); split it", what, rows, limit, tenant)
}

// checkRows refuses a job or stream of rows rollouts past tenant's quota.
func (b *quotaBook) checkRows(tenant, what string, rows int64) error {
	if q := b.of(tenant); q.Rows > 0 && rows > q.Rows {
		return rowsExceeded(tenant, what, rows, q.Rows)
	}
	return nil
}

// reserve takes a job slot and the job's sandboxes for tenant, checking
// the job's rows; release gives them back (once).
func (b *quotaBook) reserve(tenant string, sandboxes int, rows int64) (release func(), err error) {
	if err := b.checkRows(tenant, "this job", rows); err != nil {
		return nil, err
	}
	q := b.of(tenant)
	b.mu.Lock()
	defer b.mu.Unlock()
	u := b.held[tenant]
	if u == nil {
		u = &quotaUse{}
		b.held[tenant] = u
	}
	switch {
	case q.Jobs > 0 && u.jobs+1 > q.Jobs:
		metricTenantRejected.WithLabelValues(tenantLabel(tenant), "jobs").Inc()
		return nil, status.Errorf(codes.ResourceExhausted,
			"quota: tenant %s already runs %d jobs or collect streams, it may run %d at once (rollout serve --quota-jobs, or the tenant's quotas.jobs); wait for one to end or cancel one", tenant, u.jobs, q.Jobs)
	case q.Sandboxes > 0 && u.sandboxes+sandboxes > q.Sandboxes:
		metricTenantRejected.WithLabelValues(tenantLabel(tenant), "sandboxes").Inc()
		return nil, status.Errorf(codes.ResourceExhausted,
			"quota: limits.sandboxes %d on top of the %d held by tenant %s's running jobs exceeds its %d (rollout serve --quota-sandboxes, or the tenant's quotas.sandboxes); lower limits.sandboxes or wait",
			sandboxes, u.sandboxes, tenant, q.Sandboxes)
	}
	u.jobs++
	u.sandboxes += sandboxes
	b.observe(tenant, u)
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			u.jobs--
			u.sandboxes -= sandboxes
			b.observe(tenant, u)
			if u.jobs == 0 && u.sandboxes == 0 {
				delete(b.held, tenant)
			}
		})
	}, nil
}

// observe publishes what tenant holds. b.mu is held.
func (b *quotaBook) observe(tenant string, u *quotaUse) {
	l := tenantLabel(tenant)
	metricTenantHeld.WithLabelValues(l, "jobs").Set(float64(u.jobs))
	metricTenantHeld.WithLabelValues(l, "sandboxes").Set(float64(u.sandboxes))
}

// tenantLabel bounds the tenant label's values: tenant names come from the
// operator's configuration (a bounded set); job records from before
// tenants carry token digests, which share one value.
func tenantLabel(tenant string) string {
	if strings.HasPrefix(tenant, "token:") {
		return "legacy"
	}
	return tenant
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
