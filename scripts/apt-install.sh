#!/bin/sh
# apt-install.sh PKG... — installs Debian packages with apt-get for the
# project's scripts (ensure-*.sh, k8s-lab/lab.sh), as root. Another apt
# process holding the dpkg lock (a fresh cloud machine's boot-time updates)
# is waited for, at most ROLLOUT_DPKG_LOCK_TIMEOUT seconds (default 300,
# apt-get's DPkg::Lock::Timeout), and named: when the wait starts, and in
# the failure when it did not end in time. The package lists are updated
# only when the install fails for another reason. sandbox/image's Go code
# does the same (aptInstall).
set -u
TIMEOUT=${ROLLOUT_DPKG_LOCK_TIMEOUT:-300}
case $TIMEOUT in
''|*[!0-9]*)
	echo "apt-install.sh: ROLLOUT_DPKG_LOCK_TIMEOUT=$TIMEOUT: want a whole number of seconds >= 0" >&2
	exit 2
	;;
esac
LOCKS="/var/lib/dpkg/lock-frontend /var/lib/dpkg/lock /var/lib/apt/lists/lock /var/cache/apt/archives/lock"

# holders prints "pid N (cmdline) holds FILE" for each lock held now, from
# /proc/locks (apt takes fcntl locks; an entry names the file's inode).
holders() {
	for f in $LOCKS; do
		[ -e "$f" ] || continue
		ino=$(stat -c %i "$f") || continue
		awk -v ino="$ino" '$2 != "->" { n = split($6, d, ":"); if (d[n] == ino) print $5 }' /proc/locks 2>/dev/null | sort -u |
			while read -r pid; do
				cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)
				echo "pid $pid (${cmd:-exited}) holds $f"
			done
	done
}

apt() {
	h=$(holders)
	[ -z "$h" ] || echo "apt-install: waiting up to $TIMEOUT s for the dpkg lock: $(echo "$h" | paste -sd';' -)" >&2
	DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout="$TIMEOUT" "$@"
}

locked_fail() {
	h=$(holders)
	[ -n "$h" ] || return 0
	echo "apt-install: the dpkg lock is still held after $TIMEOUT s: $(echo "$h" | paste -sd';' -) — another package manager is running (e.g. a boot-time unattended-upgrades): let it finish, then run again" >&2
	exit 1
}

[ $# -gt 0 ] || { echo "usage: apt-install.sh PKG..." >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "apt-install: installing $* needs root (sudo apt-get install $*)" >&2; exit 1; }
command -v apt-get >/dev/null || { echo "apt-install: apt-get is not available: install $* with your package manager" >&2; exit 1; }
apt install -y --no-install-recommends "$@" && exit 0
locked_fail
apt update && apt install -y --no-install-recommends "$@" && exit 0
locked_fail
echo "apt-install: apt-get could not install $*" >&2
exit 1
