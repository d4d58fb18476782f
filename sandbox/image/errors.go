package image

import "errors"

// Error classes, tested with errors.Is.
var (
	// ErrUnknownRecipe: no base image recipe has that name.
	ErrUnknownRecipe = errors.New("unknown image recipe")
	// ErrMissingTool: a host tool the recipe needs (mmdebstrap,
	// busybox-static) is missing and cannot be installed here; the message
	// says what to install.
	ErrMissingTool = errors.New("missing host tool")
	// ErrBaseMissing: a task image's FROM image is not present locally (the
	// engine cannot pull here).
	ErrBaseMissing = errors.New("base image not present locally")
	// ErrInvalidContext: a task image's Dockerfile or build context is
	// unusable.
	ErrInvalidContext = errors.New("invalid build context")
	// ErrBuild: the engine rejected or failed the build.
	ErrBuild = errors.New("image build failed")
)
