// Package imageref names container images in a registry the user gives
// (HOST[:PORT]): the one rule shared by the image push and the Kubernetes
// backend's pod images.
package imageref

import (
	"errors"
	"fmt"
	"strings"

	"github.com/distribution/reference"
)

// InRegistry returns ref as it is named in registry (HOST[:PORT]): ref
// itself when it already names a registry (its first path component has a
// dot or a colon, or is localhost), else registry/ref. Both the push
// (sandbox/image) and the Kubernetes backend (sandbox.kubernetes.image_registry)
// name images this way.
func InRegistry(registry, ref string) string {
	if registry == "" {
		return ref
	}
	first, _, hasSlash := strings.Cut(ref, "/")
	if hasSlash && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return ref
	}
	return strings.TrimSuffix(registry, "/") + "/" + ref
}

// CheckRegistry validates a registry address (HOST[:PORT], no scheme, no
// path).
func CheckRegistry(registry string) error {
	if registry == "" {
		return errors.New("registry: empty (want HOST[:PORT], e.g. 127.0.0.1:5000)")
	}
	if strings.Contains(registry, "://") || strings.Contains(registry, "/") {
		return fmt.Errorf("registry %q: want HOST[:PORT] without a scheme or path", registry)
	}
	if _, err := reference.ParseNormalizedNamed(registry + "/x:y"); err != nil {
		return fmt.Errorf("registry %q: %w", registry, err)
	}
	return nil
}
