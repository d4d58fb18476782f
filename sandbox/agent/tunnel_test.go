package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"os"
	"strconv"
	"testing"
)

// frames reads the server's frames and files them by request id.
type frames struct {
	t  *testing.T
	c  *client
	by map[uint32]chan Frame
}

func newFrames(t *testing.T, c *client) *frames {
	f := &frames{t: t, c: c, by: map[uint32]chan Frame{}}
	for id := uint32(1); id < 64; id++ {
		f.by[id] = make(chan Frame, 1024)
	}
	go func() {
		for {
			fr, err := ReadFrame(c.r)
			if err != nil {
				return
			}
			if ch := f.by[fr.ID]; ch != nil {
				ch <- fr
			}
		}
	}()
	return f
}

func (f *frames) send(typ byte, id uint32, payload []byte) {
	f.t.Helper()
	if err := WriteFrame(f.c.w, typ, id, payload); err != nil {
		f.t.Fatal(err)
	}
}

func (f *frames) request(id uint32, req Request) {
	b, _ := json.Marshal(req)
	f.send(FrameRequest, id, b)
}

func (f *frames) next(id uint32) Frame { return <-f.by[id] }

// response skips id's Data/End frames up to its Response.
func (f *frames) response(id uint32) Response {
	for {
		fr := f.next(id)
		if fr.Type == FrameResponse {
			var r Response
			_ = json.Unmarshal(fr.Payload, &r)
			return r
		}
	}
}

func openFDs(t *testing.T) int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	return len(ents)
}

// A listener on a loopback port relays a connection both ways, with
// half-close, a graceful close and an abort; cancelling the listener
// closes what it accepted; nothing is left open.
func TestTunnelRelay(t *testing.T) {
	c := startServer(t)
	f := newFrames(t, c)
	fds := openFDs(t)

	f.request(1, Request{Op: OpListen})
	first := f.next(1)
	var li ListenInfo
	if first.Type != FrameData || json.Unmarshal(first.Payload, &li) != nil || li.Port == 0 {
		t.Fatalf("listen: %q %q", first.Type, first.Payload)
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(li.Port))

	// 1: half-close both ways, big bytes.
	f.request(2, Request{Op: OpAccept, Listener: 1})
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if fr := f.next(2); fr.Type != FrameData || !bytes.Contains(fr.Payload, []byte(`"remote":"127.0.0.1:`)) {
		t.Fatalf("accept: %q %q", fr.Type, fr.Payload)
	}
	up := bytes.Repeat([]byte{0, 1, 2, 0xff}, 100000)
	go func() {
		_, _ = nc.Write(up)
		_ = nc.(*net.TCPConn).CloseWrite()
	}()
	var got []byte
	for {
		fr := f.next(2)
		if fr.Type == FrameEnd {
			break
		}
		got = append(got, fr.Payload...)
	}
	if !bytes.Equal(got, up) {
		t.Fatalf("host got %d bytes of %d", len(got), len(up))
	}
	down := bytes.Repeat([]byte("down"), 50000)
	for b := down; len(b) > 0; b = b[min(len(b), ChunkSize):] {
		f.send(FrameData, 2, b[:min(len(b), ChunkSize)])
	}
	f.send(FrameEnd, 2, nil)
	back, err := io.ReadAll(nc)
	if err != nil || !bytes.Equal(back, down) {
		t.Fatalf("sandbox got %d bytes of %d: %v", len(back), len(down), err)
	}
	if r := f.response(2); r.Err != "" {
		t.Fatalf("relay: %+v", r)
	}
	_ = nc.Close()

	// 2: a graceful close from the host delivers what it sent, then EOF.
	f.request(3, Request{Op: OpAccept, Listener: 1})
	nc, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	f.next(3)
	f.send(FrameData, 3, []byte("bye"))
	f.send(FrameEnd, 3, []byte(EndClose))
	if back, err := io.ReadAll(nc); err != nil || string(back) != "bye" {
		t.Fatalf("after close: %q %v", back, err)
	}
	if r := f.response(3); r.Err != "" {
		t.Fatalf("graceful close: %+v", r)
	}
	_ = nc.Close()

	// 3: cancelling the listener ends a relayed connection and a pending
	// accept, and frees the port.
	f.request(4, Request{Op: OpAccept, Listener: 1})
	nc, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	f.next(4)
	f.request(5, Request{Op: OpAccept, Listener: 1})
	f.send(FrameCancel, 1, nil)
	if r := f.response(1); r.Err != "" {
		t.Fatalf("listener: %+v", r)
	}
	if r := f.response(4); r.Code != CodeFailed {
		t.Fatalf("relayed connection after the listener closed: %+v", r)
	}
	if r := f.response(5); r.Code != CodeFailed {
		t.Fatalf("pending accept after the listener closed: %+v", r)
	}
	if b, _ := io.ReadAll(nc); len(b) != 0 {
		t.Fatalf("read %q from a closed tunnel", b)
	}
	if _, err := net.Dial("tcp", addr); err == nil {
		t.Fatal("the port is still served")
	}

	// Errors: unknown listener, bad port.
	f.request(6, Request{Op: OpAccept, Listener: 99})
	if r := f.response(6); r.Code != CodeNotFound {
		t.Fatalf("unknown listener: %+v", r)
	}
	f.request(7, Request{Op: OpListen, Port: -1})
	if r := f.response(7); r.Code != CodeInvalid {
		t.Fatalf("bad port: %+v", r)
	}
	_ = nc.Close()
	if now := openFDs(t); now > fds {
		t.Fatalf("%d descriptors open, %d before", now, fds)
	}
}
