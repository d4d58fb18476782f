package server

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// healthPrefix is exempt from auth and rate limits: load balancers and
// orchestrators probe health without credentials.
const healthPrefix = "/grpc.health.v1.Health/"

// ErrInsecureListen is returned for a non-loopback listen address without
// an auth token.
var ErrInsecureListen = errors.New("refusing to listen on a non-loopback address without an auth token (--auth-token-file)")

// CheckListen enforces the listen policy: loopback addresses (127.0.0.0/8,
// ::1, localhost) and unix sockets are open to local users; anything else
// needs a bearer token.
func CheckListen(addr string, haveToken bool) error {
	if haveToken || IsLocalAddr(addr) {
		return nil
	}
	return fmt.Errorf("%w: %s", ErrInsecureListen, addr)
}

// IsLocalAddr reports whether addr (host:port or unix:PATH) is reachable
// only from this machine. An empty host ("":50051) means every interface.
func IsLocalAddr(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}

// ReadTokenFile reads a bearer token: the file's content without
// surrounding whitespace; empty is an error.
func ReadTokenFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("auth token: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("auth token: %s is empty", path)
	}
	if strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("auth token: %s holds more than one word", path)
	}
	return tok, nil
}

// tokenAuth checks "authorization: Bearer <token>" in constant time. Both
// sides are hashed first so the comparison does not leak the length.
type tokenAuth struct{ want [32]byte }

func newTokenAuth(token string) *tokenAuth { return &tokenAuth{want: sha256.Sum256([]byte(token))} }

func (a *tokenAuth) check(ctx context.Context) error {
	md, _ := metadata.FromIncomingContext(ctx)
	vals := md.Get("authorization")
	if len(vals) == 0 {
		return status.Error(codes.Unauthenticated, "authorization: missing bearer token")
	}
	const prefix = "bearer "
	v := vals[0]
	if len(v) < len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return status.Error(codes.Unauthenticated, "authorization: want \"Bearer <token>\"")
	}
	got := sha256.Sum256([]byte(strings.TrimSpace(v[len(prefix):])))
	if subtle.ConstantTimeCompare(got[:], a.want[:]) != 1 {
		return status.Error(codes.Unauthenticated, "authorization: invalid bearer token")
	}
	return nil
}

// guard is the interceptor chain's policy: auth, then the rate limit.
type guard struct {
	auth  *tokenAuth    // nil: no auth
	limit *rate.Limiter // nil: no limit
}

func (g *guard) admit(ctx context.Context, method string) error {
	if strings.HasPrefix(method, healthPrefix) {
		return nil
	}
	if g.auth != nil {
		if err := g.auth.check(ctx); err != nil {
			return err
		}
	}
	if g.limit != nil && !g.limit.Allow() {
		return status.Error(codes.ResourceExhausted, "rate limit exceeded: retry with backoff")
	}
	return nil
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	if err := g.admit(ctx, info.FullMethod); err != nil {
		return nil, err
	}
	return next(ctx, req)
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	if err := g.admit(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return next(srv, ss)
}

// bearer is the client side: per-RPC credentials carrying the token.
type bearer struct{ token string }

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials. The
// server accepts tokens without TLS (it warns when it listens off loopback
// without TLS), so the client does not insist either.
func (b bearer) RequireTransportSecurity() bool { return false }
