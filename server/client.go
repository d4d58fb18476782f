package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// ClientOptions say how to reach a running service (`rollout job ...`).
type ClientOptions struct {
	// Addr is host:port or unix:PATH.
	Addr string
	// Token is sent as "authorization: Bearer <token>" on every call.
	Token string
	// TLS connects with TLS, verifying the server against the system
	// roots, or CAFile when set.
	TLS    bool
	CAFile string
	// ServerName overrides the name verified in the server's certificate.
	ServerName string
	// InsecureSkipVerify connects with TLS without verifying the server
	// (testing only).
	InsecureSkipVerify bool
	// CertFile and KeyFile, when set, are the client certificate to
	// present (a tenant known by its certificate; implies TLS).
	CertFile, KeyFile string
	// MaxMsgSize bounds received messages (default DefaultMaxMsgSize).
	MaxMsgSize int
}

// Client is a connection to the service.
type Client struct {
	rolloutv1.RolloutServiceClient
	Conn *grpc.ClientConn
}

// Close closes the connection.
func (c *Client) Close() error { return c.Conn.Close() }

// Dial connects to the service (lazily: the first call dials).
func Dial(o ClientOptions) (*Client, error) {
	if o.MaxMsgSize <= 0 {
		o.MaxMsgSize = DefaultMaxMsgSize
	}
	creds := insecure.NewCredentials()
	if o.TLS || o.CAFile != "" || o.InsecureSkipVerify || o.CertFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.ServerName, InsecureSkipVerify: o.InsecureSkipVerify} //nolint:gosec // explicit opt-in
		if o.CertFile != "" {
			cert, err := tls.LoadX509KeyPair(o.CertFile, o.KeyFile)
			if err != nil {
				return nil, fmt.Errorf("tls client certificate: %w", err)
			}
			cfg.Certificates = []tls.Certificate{cert}
		}
		if o.CAFile != "" {
			pem, err := os.ReadFile(o.CAFile)
			if err != nil {
				return nil, fmt.Errorf("tls ca: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("tls ca: no PEM certificate in %s", o.CAFile)
			}
			cfg.RootCAs = pool
		}
		creds = credentials.NewTLS(cfg)
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(o.MaxMsgSize), grpc.MaxCallSendMsgSize(o.MaxMsgSize)),
	}
	if o.Token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(bearer{token: o.Token}))
	}
	target := o.Addr
	if target == "" {
		return nil, fmt.Errorf("dial: empty address")
	}
	conn, err := grpc.NewClient(target, opts...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", target, err)
	}
	return &Client{RolloutServiceClient: rolloutv1.NewRolloutServiceClient(conn), Conn: conn}, nil
}

// LoadClientCA makes cfg (a server's, from LoadTLS) verify client
// certificates signed by the CA in caFile, when a client presents one:
// tenants are then known by their certificate's names too
// (Tenant.ClientNames); a client without one still authenticates with a
// bearer token.
func LoadClientCA(cfg *tls.Config, caFile string) error {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return fmt.Errorf("tls client ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return fmt.Errorf("tls client ca: no PEM certificate in %s", caFile)
	}
	cfg.ClientCAs = pool
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
	return nil
}

// LoadTLS loads a server certificate and key for Transport.TLS.
func LoadTLS(certFile, keyFile string) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("tls: load %s and %s: %w", certFile, keyFile, err)
	}
	return &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}}, nil
}
