// Package docker is the Docker backend: each sandbox is a container of the
// local (or remote) Docker engine, the agent attached over the container's
// stdio or a unix socket. It owns its options, the egress network, the
// disk watchdog, the owner watchdog and the orphan reaper.
package docker
