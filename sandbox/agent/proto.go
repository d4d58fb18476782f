package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
)

// Frame types. Every frame is: type (1 byte) | request id (uint32, big
// endian) | payload length (uint32, big endian) | payload.
const (
	FrameHello    byte = 'H' // agent → host, id 0, JSON Hello, once at start-up
	FrameRequest  byte = 'Q' // host → agent, JSON Request; opens request id
	FrameData     byte = 'D' // both ways: a chunk of the request's byte stream
	FrameEnd      byte = 'E' // both ways: end of the byte stream (payload: abort reason, if any)
	FrameCancel   byte = 'C' // host → agent: abandon the request (kills its command)
	FrameResponse byte = 'R' // agent → host, JSON Response; closes request id
)

// MaxFrame bounds one frame's payload; larger byte streams are chunked into
// Data frames of at most ChunkSize.
const (
	MaxFrame  = 32 << 20
	ChunkSize = 64 << 10
)

// ProtocolVersion is checked by the host against Hello.Version.
const ProtocolVersion = 1

// Ops of Request.Op.
const (
	OpPing     = "ping"
	OpExec     = "exec"
	OpStart    = "start"
	OpPoll     = "poll"
	OpWait     = "wait"
	OpKill     = "kill"
	OpStdin    = "stdin"
	OpList     = "list"
	OpKillAll  = "killall"  // SIGKILL every process but init and the agent (before a reward)
	OpWrite    = "write"    // request, then Data frames + End: the file's bytes
	OpRead     = "read"     // response Data frames + End, then Response
	OpUpload   = "upload"   // request, then Data frames + End: a tar stream
	OpDownload = "download" // response Data frames + End (a tar stream), then Response
	// OpPipe runs a command with both ends streamed: the host's Data frames
	// are its stdin (End closes stdin), its stdout comes back as Data
	// frames, End when stdout closed, then a Response with Exec (exit code,
	// capped stderr). Cancel kills its process group. For stdio servers
	// (MCP) inside the sandbox.
	OpPipe = "pipe"
	// OpReset returns a used container to the state of a freshly started
	// one (read-only root only): it cancels every other request, kills
	// every process but init and the agent, forgets background processes
	// and the shell session, removes the sandbox user's SysV IPC objects
	// and empties the mount roots of Request.Paths (tmpfs or mqueue mounts
	// recorded at start-up), restoring their mode, owner, times and xattrs.
	// Request.TimeoutNS bounds it (default 60 s). Any doubt is an error,
	// never a partial success: the host then removes the container.
	OpReset = "reset"
	// OpListen binds a TCP listener on 127.0.0.1:Request.Port inside the
	// sandbox (port 0: the kernel picks one; loopback only, never another
	// address). The request stays open as long as the listener: the agent
	// first sends one Data frame holding a JSON ListenInfo (the bound
	// port), and answers the Response only when the listener closed (on
	// Cancel, when its channel ends, or on a reset), after closing every
	// connection accepted from it.
	OpListen = "listen"
	// OpAccept takes the next connection of the listener opened by the
	// request id Request.Listener (on the same channel). The agent first
	// sends one Data frame holding a JSON AcceptInfo, then relays: bytes
	// the connection's peer writes come as Data frames, its half-close as
	// an End frame; the host's Data frames are written to it, its End
	// (no payload) half-closes it (CloseWrite), End with EndClose closes
	// it once everything sent before was written, any other End payload
	// or a Cancel aborts it. The Response comes when the connection is
	// closed; an aborted relay sends End with a payload first.
	OpAccept = "accept"
	// OpDial connects to 127.0.0.1:Request.Port inside the sandbox (a
	// server a process of the sandbox listens on; loopback only) and
	// relays the connection exactly like OpAccept: one Data frame holding
	// a JSON AcceptInfo, then the bytes both ways. The host reaches a
	// server in a sandbox that has no network (an env server, docs/env-protocols.md).
	OpDial = "dial"
)

// EndClose is the End frame payload a host sends on an OpAccept stream
// for a full close: write what was sent, then close the connection (a
// TCP close, not an abort). Other ops treat it as a plain End.
const EndClose = "close"

// ListenInfo is the first Data frame of an OpListen request.
type ListenInfo struct {
	Port int `json:"port"`
}

// AcceptInfo is the first Data frame of an OpAccept request.
type AcceptInfo struct {
	Remote string `json:"remote"` // the in-sandbox peer's address
}

// Error codes of Response.Code, mapped to the sandbox error classes.
const (
	CodeInvalid  = "invalid"
	CodeNotFound = "notfound"
	CodeFailed   = "failed"
)

// Hello is the first frame the agent sends.
type Hello struct {
	Version int    `json:"version"`
	PID     int    `json:"pid"`
	UID     int    `json:"uid"` // uid commands run as
	GID     int    `json:"gid"`
	User    string `json:"user"`
	Workdir string `json:"workdir"`
	Err     string `json:"err,omitempty"` // set when start-up failed (e.g. unknown user); the agent then exits
	// Socket: the agent also serves this protocol on the unix socket of
	// -socket (the host's listener), and sent a Hello there first.
	// SocketErr says why it could not connect when -socket was given.
	Socket    bool   `json:"socket,omitempty"`
	SocketErr string `json:"socket_err,omitempty"`
}

// ExecSpec is one command for OpExec / OpStart.
type ExecSpec struct {
	Argv      []string          `json:"argv,omitempty"`
	Command   string            `json:"command,omitempty"`
	Shell     bool              `json:"shell,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Stdin     []byte            `json:"stdin,omitempty"`
	TimeoutNS int64             `json:"timeout_ns,omitempty"`
	OutputCap int               `json:"output_cap,omitempty"`
	Merge     bool              `json:"merge,omitempty"`
	KeepStdin bool              `json:"keep_stdin,omitempty"` // background: stdin stays open for OpStdin
}

// Request is a host → agent call.
type Request struct {
	Op        string    `json:"op"`
	Exec      *ExecSpec `json:"exec,omitempty"`
	Proc      string    `json:"proc,omitempty"`
	Path      string    `json:"path,omitempty"`
	Mode      uint32    `json:"mode,omitempty"`
	TimeoutNS int64     `json:"timeout_ns,omitempty"`
	Data      []byte    `json:"data,omitempty"`
	Close     bool      `json:"close,omitempty"`    // OpStdin: close stdin after writing Data
	Paths     []string  `json:"paths,omitempty"`    // OpReset: the mount roots to empty
	Port      int       `json:"port,omitempty"`     // OpListen: the loopback port (0: any); OpDial: the port to connect to
	Listener  uint32    `json:"listener,omitempty"` // OpAccept: the OpListen request's id
}

// ExecResult is the outcome of OpExec.
type ExecResult struct {
	ExitCode        int    `json:"exit_code"`
	Stdout          []byte `json:"stdout,omitempty"`
	Stderr          []byte `json:"stderr,omitempty"`
	StdoutTotal     int64  `json:"stdout_total"`
	StderrTotal     int64  `json:"stderr_total"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	TimedOut        bool   `json:"timed_out,omitempty"`
	DurationNS      int64  `json:"duration_ns"`
}

// ProcInfo describes a background process.
type ProcInfo struct {
	ID          string `json:"id"`
	Command     string `json:"command"`
	PID         int    `json:"pid"`
	Running     bool   `json:"running"`
	ExitCode    int    `json:"exit_code"`
	StartedNS   int64  `json:"started_ns"`
	Output      []byte `json:"output,omitempty"`
	OutputTotal int64  `json:"output_total"`
	Truncated   bool   `json:"truncated,omitempty"`
}

// Response is the agent's final answer to a request.
type Response struct {
	Err   string      `json:"err,omitempty"`
	Code  string      `json:"code,omitempty"`
	Exec  *ExecResult `json:"exec,omitempty"`
	Proc  *ProcInfo   `json:"proc,omitempty"`
	Procs []ProcInfo  `json:"procs,omitempty"`
	Size  int64       `json:"size,omitempty"`
	// Killed is the number of processes OpKillAll signalled.
	Killed int `json:"killed,omitempty"`
	// Reset is OpReset's outcome.
	Reset *ResetResult `json:"reset,omitempty"`
}

// ResetResult is the outcome of OpReset.
type ResetResult struct {
	Killed     int   `json:"killed"`      // processes killed
	Removed    int   `json:"removed"`     // directory entries removed under Paths
	IPC        int   `json:"ipc"`         // SysV IPC objects removed
	DurationNS int64 `json:"duration_ns"` // time the reset took in the agent
}

// ErrFrameTooLarge is returned when a peer announces a payload above MaxFrame.
var ErrFrameTooLarge = errors.New("frame too large")

// Frame is one decoded frame.
type Frame struct {
	Type    byte
	ID      uint32
	Payload []byte
}

// WriteFrame writes one frame; callers serialise concurrent writers.
func WriteFrame(w io.Writer, typ byte, id uint32, payload []byte) error {
	if len(payload) > MaxFrame {
		return fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, len(payload))
	}
	var hdr [9]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:5], id)
	binary.BigEndian.PutUint32(hdr[5:9], uint32(len(payload)))
	if len(payload) == 0 {
		_, err := w.Write(hdr[:])
		return err
	}
	// One writev on a socket (the host's unix socket and attach
	// connection): a header written alone would wake the reader for 9
	// bytes and again for the payload. Other writers get two Writes.
	bufs := net.Buffers{hdr[:], payload}
	_, err := bufs.WriteTo(w)
	return err
}

// ReadFrame reads one frame. The payload is freshly allocated.
func ReadFrame(r io.Reader) (Frame, error) {
	var hdr [9]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return Frame{}, err
	}
	n := binary.BigEndian.Uint32(hdr[5:9])
	if n > MaxFrame {
		return Frame{}, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	f := Frame{Type: hdr[0], ID: binary.BigEndian.Uint32(hdr[1:5])}
	switch f.Type {
	case FrameHello, FrameRequest, FrameData, FrameEnd, FrameCancel, FrameResponse:
	default:
		return Frame{}, fmt.Errorf("unknown frame type 0x%02x", f.Type)
	}
	if n > 0 {
		f.Payload = make([]byte, n)
		if _, err := io.ReadFull(r, f.Payload); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return Frame{}, err
		}
	}
	return f, nil
}
