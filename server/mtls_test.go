package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	rolloutv1 "github.com/rollout-rl/rollout/gen/rollout/v1"
)

// certs writes a CA, a server certificate for 127.0.0.1 and client
// certificates with the given common names (files <name>.crt/.key in dir).
func certs(t *testing.T, dir string, clients ...string) {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	write := func(name string, der []byte, k *ecdsa.PrivateKey) {
		if err := os.WriteFile(filepath.Join(dir, name+".crt"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		kb, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name+".key"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	caKey := key()
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test ca"}, NotBefore: time.Now().Add(-time.Hour),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	write("ca", caDER, caKey)
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage, ips []net.IP) {
		k := key()
		c := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name}, NotBefore: time.Now().Add(-time.Hour),
			NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{usage}, KeyUsage: x509.KeyUsageDigitalSignature, IPAddresses: ips}
		der, err := x509.CreateCertificate(rand.Reader, c, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		write(name, der, k)
	}
	leaf("server", 2, x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	for i, c := range clients {
		leaf(c, int64(3+i), x509.ExtKeyUsageClientAuth, nil)
	}
}

// A tenant known by its client certificate: the certificate alone
// authenticates it, its jobs are its own, and a certificate naming no
// tenant (or none at all) still needs a token.
func TestTenantByClientCertificate(t *testing.T) {
	dir := t.TempDir()
	certs(t, dir, "trainer-a", "stranger")
	cfg, err := LoadTLS(filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"))
	if err != nil {
		t.Fatal(err)
	}
	if err := LoadClientCA(cfg, filepath.Join(dir, "ca.crt")); err != nil {
		t.Fatal(err)
	}
	s := newSim(t, "toolcall-match", -1)
	h := startServer(t, Options{Tenants: []Tenant{
		{Name: "alice", ClientNames: []string{"trainer-a"}},
		tenant("bob", "bob-token", Quotas{}),
	}}, RunOptions{Transport: Transport{TLS: cfg}})
	ctx := bg(t)
	dial := func(o ClientOptions) *Client {
		o.Addr, o.CAFile = h.addr, filepath.Join(dir, "ca.crt")
		c, err := Dial(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	alice := dial(ClientOptions{CertFile: filepath.Join(dir, "trainer-a.crt"), KeyFile: filepath.Join(dir, "trainer-a.key")})
	stranger := dial(ClientOptions{CertFile: filepath.Join(dir, "stranger.crt"), KeyFile: filepath.Join(dir, "stranger.key")})
	bob := dial(ClientOptions{Token: "bob-token"})
	nobody := dial(ClientOptions{})

	job, err := alice.StartJob(ctx, startReq(jobYAML(s.URL, "runs/alice", 1, 2), ""))
	if err != nil {
		t.Fatalf("alice by certificate: %v", err)
	}
	if res := (&harness{cli: alice}).watch(ctx, job.Job.Id, false, nil); res.finished.GetState() != rolloutv1.JobState_JOB_STATE_SUCCEEDED {
		t.Fatalf("alice's job: %v (%v)", res.finished, res.err)
	}
	if _, err := bob.GetJob(ctx, &rolloutv1.GetJobRequest{JobId: job.Job.Id}); status.Code(err) != codes.NotFound {
		t.Errorf("bob reads alice's job: %v", err)
	}
	for name, c := range map[string]*Client{"a certificate naming no tenant": stranger, "no certificate, no token": nobody} {
		if _, err := c.ListJobs(ctx, &rolloutv1.ListJobsRequest{}); status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v, want Unauthenticated", name, err)
		}
	}
}
