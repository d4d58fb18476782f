package bench

import "syscall"

// raiseNoFile raises this process's open-file limit (soft, and hard when
// privileged) to at least want, for itself and the children it starts,
// and returns the soft limit in force.
func raiseNoFile(want uint64) (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, err
	}
	if l.Cur >= want {
		return l.Cur, nil
	}
	n := l
	n.Cur = want
	if n.Max < want {
		n.Max = want
	}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err != nil {
		// Unprivileged: as far as the hard limit allows.
		n = syscall.Rlimit{Cur: min(want, l.Max), Max: l.Max}
		if err2 := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &n); err2 != nil {
			return l.Cur, err2
		}
		return n.Cur, err
	}
	return n.Cur, nil
}
