// Package host holds what the backends that run sandboxes on this host
// (docker, runc) share: owner labels and the reaper's rules, admission
// against the host's free memory and disk, and the disk watchdog.
package host
