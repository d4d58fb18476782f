package agent

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// setup resolves the sandbox user and prepares the working directory.
func (s *server) setup(user, fallback string, optional bool, workdir string) error {
	u, err := lookupUser(user)
	if err != nil && optional {
		u, err = lookupUser(fallback)
	}
	if err != nil {
		return err
	}
	s.uid, s.gid, s.user, s.home = u.uid, u.gid, u.name, u.home
	if workdir == "" {
		workdir = "/"
	}
	if !strings.HasPrefix(workdir, "/") {
		return fmt.Errorf("workdir %q is not absolute", workdir)
	}
	s.workdir = workdir
	if err := s.prepareDirs(); err != nil {
		return err
	}
	env := os.Environ()
	set := map[string]string{"HOME": s.home, "USER": s.user, "LOGNAME": s.user}
	out := env[:0]
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		if _, override := set[k]; !override {
			out = append(out, kv)
		}
	}
	for _, k := range []string{"HOME", "USER", "LOGNAME"} {
		if set[k] != "" {
			out = append(out, k+"="+set[k])
		}
	}
	if !hasKey(out, "PATH") {
		out = append(out, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
	}
	s.baseEnv = out
	s.shellCwd = workdir
	// The mounts are recorded last, with the workdir as it is handed to the
	// first command: a reset restores exactly this.
	s.recordMounts()
	return nil
}

// prepareDirs makes the workdir (and /tmp) as the first command finds
// them; setup does it, and a reset again after emptying the mounts.
func (s *server) prepareDirs() error {
	workdir := s.workdir
	fi, err := os.Stat(workdir)
	switch {
	case os.IsNotExist(err):
		if err := os.MkdirAll(workdir, 0o755); err != nil {
			return fmt.Errorf("create workdir: %w", err)
		}
		if err := os.Chown(workdir, s.uid, s.gid); err != nil {
			return fmt.Errorf("chown workdir: %w", err)
		}
	case err != nil:
		return fmt.Errorf("workdir: %w", err)
	case !fi.IsDir():
		return fmt.Errorf("workdir %s is not a directory", workdir)
	default:
		// A fresh tmpfs (read-only root) is root's; an empty workdir is
		// handed to the user, one with content is left as the image made it.
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != s.uid {
			if entries, err := os.ReadDir(workdir); err == nil && len(entries) == 0 {
				_ = os.Chown(workdir, s.uid, s.gid)
			}
		}
	}
	// A scratch image may lack /tmp; a read-only root makes this fail, and
	// then the backend has mounted a tmpfs there anyway.
	if _, err := os.Stat("/tmp"); os.IsNotExist(err) {
		if os.Mkdir("/tmp", 0o777) == nil {
			_ = os.Chmod("/tmp", 0o1777)
		}
	}
	return nil
}

func hasKey(env []string, key string) bool {
	for _, kv := range env {
		if strings.HasPrefix(kv, key+"=") {
			return true
		}
	}
	return false
}

type userInfo struct {
	name     string
	uid, gid int
	home     string
}

// lookupUser resolves "", "name", "uid", "name:group" or "uid:gid" from
// /etc/passwd and /etc/group; "" means root.
func lookupUser(spec string) (userInfo, error) {
	if spec == "" {
		return userInfo{name: "root", home: "/root"}, nil
	}
	userPart, groupPart, hasGroup := strings.Cut(spec, ":")
	passwd := readColonFile("/etc/passwd")
	var u userInfo
	found := false
	if n, err := strconv.Atoi(userPart); err == nil && n >= 0 {
		u = userInfo{name: userPart, uid: n, gid: n, home: "/"}
		found = true
		for _, f := range passwd {
			if len(f) >= 6 && f[2] == userPart {
				u.name, u.home = f[0], f[5]
				u.gid, _ = strconv.Atoi(f[3])
			}
		}
		if n == 0 {
			u.home = "/root"
		}
	} else {
		for _, f := range passwd {
			if len(f) >= 6 && f[0] == userPart {
				uid, err1 := strconv.Atoi(f[2])
				gid, err2 := strconv.Atoi(f[3])
				if err1 != nil || err2 != nil {
					return userInfo{}, fmt.Errorf("user %q: malformed /etc/passwd entry", userPart)
				}
				u = userInfo{name: f[0], uid: uid, gid: gid, home: f[5]}
				found = true
				break
			}
		}
	}
	if !found {
		return userInfo{}, fmt.Errorf("user %q not found in /etc/passwd", userPart)
	}
	if hasGroup {
		if n, err := strconv.Atoi(groupPart); err == nil && n >= 0 {
			u.gid = n
		} else {
			ok := false
			for _, f := range readColonFile("/etc/group") {
				if len(f) >= 3 && f[0] == groupPart {
					if g, err := strconv.Atoi(f[2]); err == nil {
						u.gid, ok = g, true
					}
				}
			}
			if !ok {
				return userInfo{}, fmt.Errorf("group %q not found in /etc/group", groupPart)
			}
		}
	}
	if u.home == "" {
		u.home = "/"
	}
	return u, nil
}

func readColonFile(path string) [][]string {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out [][]string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, strings.Split(line, ":"))
	}
	return out
}
