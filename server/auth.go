package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// healthPrefix is exempt from auth and rate limits: load balancers and
// orchestrators probe health without credentials.
const healthPrefix = "/grpc.health.v1.Health/"

// ErrInsecureListen is returned for a non-loopback listen address without
// an auth token.
var ErrInsecureListen = errors.New("refusing to listen on a non-loopback address without an auth token (--auth-token-file or --tenants-file)")

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

// guard is the interceptor chain's policy: auth (which names the
// caller's tenant), then the rate limits.
type guard struct {
	auth  *tenantAuth   // nil: no auth, every caller is anonymous
	limit *rate.Limiter // nil: no limit
}

func (g *guard) admit(ctx context.Context, method string) (context.Context, error) {
	if strings.HasPrefix(method, healthPrefix) {
		return ctx, nil
	}
	if g.auth != nil {
		name, err := g.auth.check(ctx)
		if err != nil {
			return ctx, err
		}
		ctx = context.WithValue(ctx, tenantKey{}, name)
	}
	if g.limit != nil && !g.limit.Allow() {
		return ctx, status.Error(codes.ResourceExhausted, "rate limit exceeded: retry with backoff")
	}
	return ctx, nil
}

func (g *guard) unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, next grpc.UnaryHandler) (any, error) {
	ctx, err := g.admit(ctx, info.FullMethod)
	if err != nil {
		return nil, err
	}
	return next(ctx, req)
}

func (g *guard) stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, next grpc.StreamHandler) error {
	ctx, err := g.admit(ss.Context(), info.FullMethod)
	if err != nil {
		return err
	}
	return next(srv, tenantStream{ServerStream: ss, ctx: ctx})
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
