package inference

// DiffTokens counts the tokens that differ between a and b: the number of
// insertions plus deletions of a shortest edit script (Myers' O((N+M)·D)
// algorithm). Beyond maxDiffD edits it stops refining and returns an upper
// bound (the size of the region between the common prefix and suffix), so
// a badly drifted 100k-token episode costs bounded time.
func DiffTokens(a, b []int32) int {
	// Trim the common prefix and suffix: drift is usually local.
	for len(a) > 0 && len(b) > 0 && a[0] == b[0] {
		a, b = a[1:], b[1:]
	}
	for len(a) > 0 && len(b) > 0 && a[len(a)-1] == b[len(b)-1] {
		a, b = a[:len(a)-1], b[:len(b)-1]
	}
	n, m := len(a), len(b)
	if n == 0 || m == 0 {
		return n + m
	}
	limit := min(n+m, maxDiffD)
	off := limit + 1
	v := make([]int, 2*limit+3)
	for d := 0; d <= limit; d++ {
		for k := -d; k <= d; k += 2 {
			var x int
			if k == -d || (k != d && v[off+k-1] < v[off+k+1]) {
				x = v[off+k+1]
			} else {
				x = v[off+k-1] + 1
			}
			y := x - k
			for x < n && y < m && a[x] == b[y] {
				x++
				y++
			}
			v[off+k] = x
			if x >= n && y >= m {
				return d
			}
		}
	}
	return n + m
}

const maxDiffD = 4096
