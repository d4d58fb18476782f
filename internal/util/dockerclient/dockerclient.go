// Package dockerclient builds the Docker Engine API client used across the
// project and turns "cannot connect" into one actionable line.
package dockerclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/moby/moby/client"
)

// ErrUnreachable is wrapped by every "engine not reachable" error.
var ErrUnreachable = errors.New("docker engine unreachable")

// Host returns the engine address the client will use (DOCKER_HOST or the
// default socket), for messages.
func Host() string {
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		return h
	}
	return client.DefaultDockerHost
}

// New returns a client configured from the environment (DOCKER_HOST,
// DOCKER_TLS_VERIFY, DOCKER_CERT_PATH) with API version negotiation, after
// checking that the engine answers a ping within 5 seconds.
func New(ctx context.Context) (*client.Client, error) {
	c, err := client.New(client.FromEnv, client.WithUserAgent("rollout"))
	if err != nil {
		return nil, fmt.Errorf("docker client for %s: %w", Host(), err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		_ = c.Close()
		return nil, Unreachable(err)
	}
	return c, nil
}

// Unreachable wraps err into the one-line, actionable "cannot reach the
// engine" error.
func Unreachable(err error) error {
	return fmt.Errorf("%w at %s (%v): start the Docker daemon (e.g. `systemctl start docker`) or set DOCKER_HOST to a reachable engine", ErrUnreachable, Host(), err)
}
