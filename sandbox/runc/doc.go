// Package runc is the runc backend: each sandbox is an OCI container run by
// the host's runc directly, with no engine daemon in the path; the local
// Docker engine serves only as the image store. It needs root.
package runc
