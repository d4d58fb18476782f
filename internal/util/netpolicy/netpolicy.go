// Package netpolicy confines the outbound connections of a job a remote
// client started: loopback, private, link-local and other non-public
// addresses are refused unless an operator's allow-list names them. The
// policy travels in the job's context; every product HTTP transport dials
// through Dialer, which checks each address it connects to (after name
// resolution, so a name that resolves — or re-resolves — to a refused
// address is refused at dial time). Without a policy in the context,
// nothing is confined (the CLI's own runs).
package netpolicy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"syscall"
)

// ErrRefused is returned for a connection or URL the policy refuses.
var ErrRefused = errors.New("refused by the server's network policy")

// Policy is an allow-list of non-public networks and host names. Public
// unicast addresses are always allowed.
type Policy struct {
	prefixes []netip.Prefix
	hosts    []string // exact names, or ".suffix" for "*.suffix"
	flag     string   // the flag that sets the allow-list, for messages
}

// New parses allow-list entries: an IP address, a CIDR prefix, a host name
// or "*.domain". flag names the option in error messages.
func New(entries []string, flag string) (*Policy, error) {
	p := &Policy{flag: flag}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		switch {
		case e == "":
			return nil, fmt.Errorf("%s: empty entry", flag)
		case strings.Contains(e, "/"):
			pr, err := netip.ParsePrefix(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %q: %w", flag, e, err)
			}
			p.prefixes = append(p.prefixes, pr.Masked())
		default:
			if a, err := netip.ParseAddr(e); err == nil {
				p.prefixes = append(p.prefixes, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
				continue
			}
			h := strings.ToLower(strings.TrimSuffix(e, "."))
			if s, ok := strings.CutPrefix(h, "*."); ok {
				h = "." + s
			}
			if strings.ContainsAny(h, " :*/") {
				return nil, fmt.Errorf("%s: %q: want an IP address, a CIDR prefix, a host name or *.domain", flag, e)
			}
			p.hosts = append(p.hosts, h)
		}
	}
	return p, nil
}

// Public reports whether a is a public unicast address: not loopback,
// private, link-local, unspecified, multicast, CGNAT (100.64.0.0/10) or
// another special-purpose range.
func Public(a netip.Addr) bool {
	a = a.Unmap()
	if !a.IsValid() || a.IsLoopback() || a.IsPrivate() || a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast() ||
		a.IsUnspecified() || a.IsMulticast() || a.IsInterfaceLocalMulticast() {
		return false
	}
	for _, p := range special {
		if p.Contains(a) {
			return false
		}
	}
	return true
}

var special = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),  // carrier-grade NAT
	netip.MustParsePrefix("192.0.0.0/24"),   // IETF protocol assignments
	netip.MustParsePrefix("198.18.0.0/15"),  // benchmarking
	netip.MustParsePrefix("240.0.0.0/4"),    // reserved, broadcast
	netip.MustParsePrefix("64:ff9b::/96"),   // NAT64 (may reach private IPv4)
	netip.MustParsePrefix("64:ff9b:1::/48"), // local-use NAT64
	netip.MustParsePrefix("2002::/16"),      // 6to4 (may embed private IPv4)
}

// AllowAddr reports whether the policy allows connecting to a.
func (p *Policy) AllowAddr(a netip.Addr) bool {
	a = a.Unmap()
	if Public(a) {
		return true
	}
	for _, pr := range p.prefixes {
		if pr.Contains(a) {
			return true
		}
	}
	return false
}

// allowHost reports whether the allow-list names host.
func (p *Policy) allowHost(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, h := range p.hosts {
		if host == h || strings.HasPrefix(h, ".") && strings.HasSuffix(host, h) {
			return true
		}
	}
	return false
}

// CheckURL checks a URL a job names before the job starts: the host is an
// allowed name, or every address it resolves to is allowed. field names
// the config key in the error. Dial-time checks still apply.
func (p *Policy) CheckURL(ctx context.Context, field, raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return fmt.Errorf("%s: %q is not a URL with a host", field, raw)
	}
	host := u.Hostname()
	if p.allowHost(host) {
		return nil
	}
	if a, err := netip.ParseAddr(host); err == nil {
		if !p.AllowAddr(a) {
			return fmt.Errorf("%s: %s: %s is a loopback, private or link-local address: %w (allow it with %s)", field, raw, a, ErrRefused, p.flag)
		}
		return nil
	}
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil {
		return fmt.Errorf("%s: %s: resolve %s: %w", field, raw, host, err)
	}
	for _, a := range addrs {
		if !p.AllowAddr(a) {
			return fmt.Errorf("%s: %s: %s resolves to %s, a loopback, private or link-local address: %w (allow it with %s)", field, raw, host, a, ErrRefused, p.flag)
		}
	}
	return nil
}

type policyKey struct{}
type allowedNameKey struct{}

// With returns ctx carrying p (nil: unconfined).
func With(ctx context.Context, p *Policy) context.Context {
	if p == nil {
		return ctx
	}
	return context.WithValue(ctx, policyKey{}, p)
}

// From returns the policy ctx carries, or nil.
func From(ctx context.Context) *Policy {
	p, _ := ctx.Value(policyKey{}).(*Policy)
	return p
}

// Dialer returns d's DialContext confined by the policy of each dial's
// context: an allowed host name dials as usual; otherwise every address
// the dialer connects to, after resolution, is checked in the socket's
// Control hook, so a name cannot be re-resolved to a refused address
// between a check and the connect. d is copied; its own Control or
// ControlContext still runs after the check.
func Dialer(d *net.Dialer) func(ctx context.Context, network, addr string) (net.Conn, error) {
	dd := *d
	control, controlCtx := d.Control, d.ControlContext
	dd.Control = nil
	dd.ControlContext = func(ctx context.Context, network, address string, c syscall.RawConn) error {
		if p := From(ctx); p != nil && ctx.Value(allowedNameKey{}) == nil {
			host, _, err := net.SplitHostPort(address)
			if err != nil {
				return fmt.Errorf("dial %s: %w", address, err)
			}
			a, err := netip.ParseAddr(host)
			if err != nil || !p.AllowAddr(a) {
				return fmt.Errorf("dial %s: a loopback, private or link-local address: %w (allow it with %s)", address, ErrRefused, p.flag)
			}
		}
		switch {
		case controlCtx != nil:
			return controlCtx(ctx, network, address, c)
		case control != nil:
			return control(network, address, c)
		}
		return nil
	}
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		if p := From(ctx); p != nil {
			if host, _, err := net.SplitHostPort(addr); err == nil && p.allowHost(host) {
				ctx = context.WithValue(ctx, allowedNameKey{}, true)
			}
		}
		return dd.DialContext(ctx, network, addr)
	}
}
