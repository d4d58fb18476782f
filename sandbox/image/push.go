package image

import (
	"context"
	"encoding/base64"
	"fmt"

	"github.com/distribution/reference"
	"github.com/moby/moby/client"
	"github.com/rollout-rl/rollout/internal/util/imageref"
)

// Pusher is what Push needs of the Docker engine.
type Pusher interface {
	ImageInspect(ctx context.Context, ref string, opts ...client.ImageInspectOption) (client.ImageInspectResult, error)
	ImageTag(ctx context.Context, opts client.ImageTagOptions) (client.ImageTagResult, error)
	ImagePush(ctx context.Context, ref string, opts client.ImagePushOptions) (client.ImagePushResponse, error)
}

var _ Pusher = (*client.Client)(nil)

// Push tags the local image ref as imageref.InRegistry(registry, ref) and pushes it
// there through the engine; it returns the pushed reference. The engine
// talks to the registry: plain HTTP only for registries it treats as
// insecure (127.0.0.0/8 by default, or its insecure-registries setting).
// Credentials, when the registry needs them, are the engine's business
// (not sent by Push).
func Push(ctx context.Context, cli Pusher, registry, ref string) (string, error) {
	if err := imageref.CheckRegistry(registry); err != nil {
		return "", err
	}
	if _, err := cli.ImageInspect(ctx, ref); err != nil {
		return "", fmt.Errorf("push %s: %w", ref, err)
	}
	target := imageref.InRegistry(registry, ref)
	named, err := reference.ParseNormalizedNamed(target)
	if err != nil {
		return "", fmt.Errorf("push %s: %w", target, err)
	}
	if d := reference.Domain(named); d != registry {
		return "", fmt.Errorf("push %s: it names registry %s, not %s", ref, d, registry)
	}
	target = reference.FamiliarString(reference.TagNameOnly(named))
	if target != ref {
		if _, err := cli.ImageTag(ctx, client.ImageTagOptions{Source: ref, Target: target}); err != nil {
			return "", fmt.Errorf("tag %s as %s: %w", ref, target, err)
		}
	}
	// An empty auth document: anonymous push (older engines reject a
	// missing header).
	auth := base64.URLEncoding.EncodeToString([]byte("{}"))
	resp, err := cli.ImagePush(ctx, target, client.ImagePushOptions{RegistryAuth: auth})
	if err != nil {
		return "", fmt.Errorf("push %s: %w", target, err)
	}
	if err := resp.Wait(ctx); err != nil {
		return "", fmt.Errorf("push %s: %w", target, err)
	}
	return target, nil
}
