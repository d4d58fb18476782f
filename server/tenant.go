package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Tenant is one client identity of the server: a name, the bearer token
// that proves it (kept as its SHA-256), and its own quotas. Jobs and
// CollectGroups streams belong to the tenant that started them; other
// tenants can neither see nor touch them.
type Tenant struct {
	// Name labels the tenant in metrics, logs and quota errors: letters,
	// digits, '-', '_' and '.', at most 64.
	Name string
	// TokenSHA256 is the SHA-256 of the tenant's bearer token (zero: the
	// tenant has no token, only client certificates).
	TokenSHA256 [32]byte
	// ClientNames are the client-certificate names that identify the
	// tenant on a server verifying client certificates (LoadClientCA): the
	// subject's common name or a DNS, email or URI name of a certificate
	// the server's client CA signed.
	ClientNames []string
	// Quotas are this tenant's; zero fields take the server's
	// (Options.Quotas, then the defaults), negative disables.
	Quotas Quotas
	// RateLimit admits that many calls per second from this tenant
	// (0: no per-tenant limit), with RateBurst as its bucket.
	RateLimit float64
	RateBurst int
}

// DefaultTenant names the tenant of the single --auth-token-file token, and
// anonymousTenant every caller of a server without auth.
const (
	DefaultTenant   = "default"
	anonymousTenant = "anonymous"
)

var tenantName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// tenantsFile is the YAML of --tenants-file.
type tenantsFile struct {
	Tenants []struct {
		Name        string   `yaml:"name"`
		TokenSHA256 string   `yaml:"token_sha256"`
		TokenFile   string   `yaml:"token_file"`
		ClientNames []string `yaml:"client_names"`
		Quotas      quotasY  `yaml:"quotas"`
		RateLimit   float64  `yaml:"rate_limit"`
		RateBurst   int      `yaml:"rate_burst"`
	} `yaml:"tenants"`
}

type quotasY struct {
	Jobs      int   `yaml:"jobs"`
	Sandboxes int   `yaml:"sandboxes"`
	Rows      int64 `yaml:"rows"`
	Sessions  int   `yaml:"sessions"`
}

// LoadTenants reads a tenants file (docs/api.md, "Tenants"): a YAML list
// of tenants, each with a name, its token as token_sha256 (hex) or
// token_file (a file holding the token, read like --auth-token-file;
// relative to the tenants file), optional quotas {jobs, sandboxes, rows,
// sessions}
// and an optional rate_limit/rate_burst. Names and tokens must be unique.
func LoadTenants(path string) ([]Tenant, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tenants: %w", err)
	}
	var f tenantsFile
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("tenants: %s: %w", path, err)
	}
	if len(f.Tenants) == 0 {
		return nil, fmt.Errorf("tenants: %s: no tenants (want tenants: [{name, token_sha256 or token_file, quotas}])", path)
	}
	names, sums, certNames := map[string]bool{}, map[[32]byte]string{}, map[string]string{}
	out := make([]Tenant, 0, len(f.Tenants))
	for i, y := range f.Tenants {
		field := fmt.Sprintf("tenants: %s: tenants[%d]", path, i)
		if !tenantName.MatchString(y.Name) || y.Name == anonymousTenant {
			return nil, fmt.Errorf("%s.name: %q: use 1-64 letters, digits, '-', '_' or '.' (and not %q)", field, y.Name, anonymousTenant)
		}
		if names[y.Name] {
			return nil, fmt.Errorf("%s.name: %q is named twice", field, y.Name)
		}
		names[y.Name] = true
		t := Tenant{Name: y.Name, Quotas: Quotas{Jobs: y.Quotas.Jobs, Sandboxes: y.Quotas.Sandboxes, Rows: y.Quotas.Rows, Sessions: y.Quotas.Sessions},
			RateLimit: y.RateLimit, RateBurst: y.RateBurst}
		if y.RateLimit < 0 || y.RateBurst < 0 {
			return nil, fmt.Errorf("%s: rate_limit and rate_burst must not be negative", field)
		}
		switch {
		case y.TokenSHA256 != "" && y.TokenFile != "":
			return nil, fmt.Errorf("%s: give one of token_sha256 and token_file, not both", field)
		case y.TokenSHA256 == "" && y.TokenFile == "" && len(y.ClientNames) == 0:
			return nil, fmt.Errorf("%s: give a token (token_sha256 or token_file) or client_names (client certificates)", field)
		case y.TokenSHA256 == "" && y.TokenFile == "":
			// certificates only
		case y.TokenSHA256 != "":
			raw, err := hex.DecodeString(strings.TrimSpace(y.TokenSHA256))
			if err != nil || len(raw) != 32 {
				return nil, fmt.Errorf("%s.token_sha256: want 64 hex digits (sha256sum of the token)", field)
			}
			copy(t.TokenSHA256[:], raw)
		default:
			p := y.TokenFile
			if !filepath.IsAbs(p) {
				p = filepath.Join(filepath.Dir(path), p)
			}
			tok, err := ReadTokenFile(p)
			if err != nil {
				return nil, fmt.Errorf("%s.token_file: %w", field, err)
			}
			t.TokenSHA256 = sha256.Sum256([]byte(tok))
		}
		for _, n := range y.ClientNames {
			if strings.TrimSpace(n) == "" {
				return nil, fmt.Errorf("%s.client_names: empty name", field)
			}
			if other, dup := certNames[n]; dup {
				return nil, fmt.Errorf("%s.client_names: %q is tenant %q's already", field, n, other)
			}
			certNames[n] = y.Name
		}
		t.ClientNames = y.ClientNames
		if t.TokenSHA256 != ([32]byte{}) {
			if other, dup := sums[t.TokenSHA256]; dup {
				return nil, fmt.Errorf("%s: the same token as tenant %q", field, other)
			}
			sums[t.TokenSHA256] = y.Name
		}
		out = append(out, t)
	}
	return out, nil
}

// TokenTenant is the tenant of a single bearer token (--auth-token-file):
// named DefaultTenant, with the server's quotas.
func TokenTenant(token string) Tenant {
	return Tenant{Name: DefaultTenant, TokenSHA256: sha256.Sum256([]byte(token))}
}

// legacyClient is how servers before tenants recorded a job's client: the
// first 6 bytes of the token's SHA-256, in hex.
func legacyClient(sum [32]byte) string { return "token:" + hex.EncodeToString(sum[:6]) }

// tenantKey carries the caller's tenant name in an RPC's context.
type tenantKey struct{}

// tenantOf is the tenant of an RPC: set by the auth interceptor, or
// anonymous on a server without auth.
func tenantOf(ctx context.Context) string {
	if t, ok := ctx.Value(tenantKey{}).(string); ok {
		return t
	}
	return anonymousTenant
}

// tenantAuth checks "authorization: Bearer <token>" against every tenant's
// token digest in constant time (all are compared, whichever matches).
type tenantAuth struct {
	tenants []Tenant
	limits  map[string]*rate.Limiter
}

func newTenantAuth(ts []Tenant) *tenantAuth {
	a := &tenantAuth{tenants: ts, limits: map[string]*rate.Limiter{}}
	for _, t := range ts {
		if t.RateLimit > 0 {
			burst := t.RateBurst
			if burst <= 0 {
				burst = max(1, int(t.RateLimit))
			}
			a.limits[t.Name] = rate.NewLimiter(rate.Limit(t.RateLimit), burst)
		}
	}
	return a
}

func (a *tenantAuth) check(ctx context.Context) (string, error) {
	if name, ok := a.byCertificate(ctx); ok {
		return a.limit(name)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return "", status.Error(codes.Unauthenticated, "authorization: missing bearer token")
	}
	const prefix = "bearer "
	v := vals[0]
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return "", status.Error(codes.Unauthenticated, "authorization: want \"Bearer <token>\"")
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(v[len(prefix):])))
	found := -1
	for i := range a.tenants {
		if subtle.ConstantTimeCompare(got[:], a.tenants[i].TokenSHA256[:]) == 1 && a.tenants[i].TokenSHA256 != ([32]byte{}) {
			found = i
		}
	}
	if found < 0 {
		return "", status.Error(codes.Unauthenticated, "authorization: invalid bearer token")
	}
	return a.limit(a.tenants[found].Name)
}

// byCertificate names the tenant of the caller's client certificate, when
// the TLS handshake verified one against the server's client CA and one of
// its names is a tenant's.
func (a *tenantAuth) byCertificate(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return "", false
	}
	leaf := ti.State.VerifiedChains[0][0]
	names := append([]string{leaf.Subject.CommonName}, leaf.DNSNames...)
	names = append(names, leaf.EmailAddresses...)
	for _, u := range leaf.URIs {
		names = append(names, u.String())
	}
	for _, t := range a.tenants {
		for _, n := range names {
			if n != "" && slices.Contains(t.ClientNames, n) {
				return t.Name, true
			}
		}
	}
	return "", false
}

// limit applies tenant name's own rate limit.
func (a *tenantAuth) limit(name string) (string, error) {
	if l := a.limits[name]; l != nil && !l.Allow() {
		metricTenantRejected.WithLabelValues(name, "rate").Inc()
		return "", status.Errorf(codes.ResourceExhausted, "rate limit of tenant %s exceeded: retry with backoff", name)
	}
	return name, nil
}

// tenantStream gives a stream handler the context carrying its tenant.
type tenantStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s tenantStream) Context() context.Context { return s.ctx }

// tenants are the tenants the transport authenticates: Options.Tenants,
// plus DefaultTenant for token when set. Jobs recorded with token's digest
// by a server before tenants belong to DefaultTenant.
func (s *Server) tenants(token string) []Tenant {
	ts := s.opts.Tenants
	if t := TokenTenant(token); token != "" && !slices.ContainsFunc(ts, func(o Tenant) bool { return o.TokenSHA256 == t.TokenSHA256 }) {
		ts = append(append([]Tenant(nil), ts...), t)
		s.mu.Lock()
		s.legacy[legacyClient(t.TokenSHA256)] = t.Name
		s.mu.Unlock()
	}
	return ts
}

// owns reports whether the caller of ctx may see and act on what client
// started (a job's recorded client, a stream's tenant). s.mu is held.
//
// A caller is anonymous only on a server without auth (with auth, the
// interceptor refuses calls without a valid token before they get here):
// there every caller is the one tenant and owns everything, as before
// tenants, including jobs a previous server recorded for a token.
func (s *Server) owns(ctx context.Context, client string) bool {
	t := tenantOf(ctx)
	if t == anonymousTenant {
		return true
	}
	if client == t {
		return true
	}
	return s.legacy[client] == t
}

// tenantOfClient is the tenant of a job's recorded client: its name, or
// the tenant holding the token a server before tenants recorded a digest
// of.
func (s *Server) tenantOfClient(client string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t, ok := s.legacy[client]; ok {
		return t
	}
	return client
}
