package server

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/rollout-rl/rollout/internal/util/netpolicy"
)

// urlKey reports whether a config key names URLs the server will connect
// to: inference endpoints, a teacher's or hint judge's endpoint, an LLM
// judge's base_url, MCP servers' and web providers' url, atropos.url, and
// any *_url, *_endpoint or *_endpoints key of env_config.
func urlKey(k string) bool {
	return k == "url" || k == "base_url" || k == "endpoint" || k == "endpoints" || k == "tokenizer_endpoints" ||
		strings.HasSuffix(k, "_url") || strings.HasSuffix(k, "_endpoint") || strings.HasSuffix(k, "_endpoints")
}

// checkURLs applies the network policy to the URLs a job's config names,
// before the job starts: a URL whose host is (or resolves to) a refused
// address fails the call with PERMISSION_DENIED naming the key. The job's
// connections are checked again when they are dialled (netpolicy.Dialer),
// so URLs the config does not spell out, and names that resolve
// differently later, are confined too.
func (s *Server) checkURLs(ctx context.Context, text, prefix string) error {
	p := s.opts.NetPolicy
	if p == nil {
		return nil
	}
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(text), &doc); err != nil {
		return nil // the config parser reports it
	}
	var walk func(n *yaml.Node, field string, named bool) error
	walk = func(n *yaml.Node, field string, named bool) error {
		switch n.Kind {
		case yaml.DocumentNode:
			for _, c := range n.Content {
				if err := walk(c, field, named); err != nil {
					return err
				}
			}
		case yaml.SequenceNode:
			for i, c := range n.Content {
				if err := walk(c, fmt.Sprintf("%s[%d]", field, i), named); err != nil {
					return err
				}
			}
		case yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				k := n.Content[i].Value
				f := k
				if field != "" {
					f = field + "." + k
				}
				if err := walk(n.Content[i+1], f, urlKey(k)); err != nil {
					return err
				}
			}
		case yaml.ScalarNode:
			v := strings.TrimSpace(n.Value)
			if named && (strings.HasPrefix(v, "http://") || strings.HasPrefix(v, "https://")) {
				if err := p.CheckURL(ctx, prefix+field, v); err != nil {
					if errors.Is(err, netpolicy.ErrRefused) {
						return status.Error(codes.PermissionDenied, err.Error())
					}
					return status.Error(codes.InvalidArgument, err.Error())
				}
			}
		}
		return nil
	}
	return walk(&doc, "", false)
}
