package kubernetes

import (
	"context"
	"log/slog"
	"sync"

	"k8s.io/klog/v2"
)

var quietOnce sync.Once

// quietClientGo sends client-go's klog output to the logger at debug
// level: it reports every stream the backend closes on purpose (Close, a
// lost pod) as an error; what matters is reported by the backend itself.
func quietClientGo(l *slog.Logger) {
	quietOnce.Do(func() {
		klog.SetSlogLogger(slog.New(debugHandler{l.Handler()}))
	})
}

// debugHandler logs every record at debug level.
type debugHandler struct{ h slog.Handler }

func (d debugHandler) Enabled(ctx context.Context, _ slog.Level) bool {
	return d.h.Enabled(ctx, slog.LevelDebug)
}

func (d debugHandler) Handle(ctx context.Context, r slog.Record) error {
	if !d.h.Enabled(ctx, slog.LevelDebug) {
		return nil // klog's bridge does not ask Enabled first
	}
	r.Level = slog.LevelDebug
	return d.h.Handle(ctx, r)
}

func (d debugHandler) WithAttrs(a []slog.Attr) slog.Handler { return debugHandler{d.h.WithAttrs(a)} }
func (d debugHandler) WithGroup(n string) slog.Handler      { return debugHandler{d.h.WithGroup(n)} }
