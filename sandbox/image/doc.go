// Package image builds the sandbox images without a container registry.
//
// Base images (rollout-sandbox:bookworm, rollout-sandbox:busybox) are built
// from Debian packages on this machine: a root filesystem tar is produced
// locally (mmdebstrap, or the static busybox binary), rewritten on the fly
// to add the non-root user `agent` (uid 1000) and /workspace, and imported
// through the Engine API. Each image carries the hash of its recipe in the
// label io.rollout.recipe-hash, so Ensure is a no-op while the recipe is
// unchanged.
//
// Task images (rollout-task:<hash>) are built from an env's Dockerfile or
// build context FROM a base image present locally, with the engine's legacy
// builder and no pulls, cached by the content hash of the context; concurrent
// requests for one image share a single build.
//
// See docs/images.md.
package image
