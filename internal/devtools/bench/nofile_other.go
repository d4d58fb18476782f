//go:build !linux

package bench

import "errors"

func raiseNoFile(uint64) (uint64, error) {
	return 0, errors.New("the scale run needs Linux (/proc and RLIMIT_NOFILE)")
}
