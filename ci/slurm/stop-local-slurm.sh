#!/usr/bin/env bash
# stop-local-slurm.sh - stop the single-host SLURM started by start-local-slurm.sh.
#
#   stop-local-slurm.sh [--keep-state] [--purge] [--quiet]
#
# Cancels all jobs; stops every slurmd and slurmctld by the PIDs in their own pid files
# (/run/slurm-ci); stops munged only if start-local-slurm.sh started it; removes the /etc/hosts
# line it added; wipes the cluster state (/var/spool/slurm-ci, /run/slurm-ci) unless --keep-state.
# Logs in /var/log/slurm-ci are kept unless --purge, which also removes the generated
# slurm.conf/gres.conf (restoring any *.pre-slurm-ci backup). Packages stay installed.
# Never kills anything by name. Safe to run when nothing is running.
set -uo pipefail

RUN=/run/slurm-ci
STATE=/var/spool/slurm-ci
LOG=/var/log/slurm-ci
CONF_DIR=/etc/slurm
MARK="# slurm-ci-local"
export PATH="/usr/sbin:/sbin:$PATH"

keep_state=0 purge=0 quiet=0
for a in "$@"; do
	case $a in
	--keep-state) keep_state=1 ;;
	--purge) purge=1 ;;
	-q | --quiet) quiet=1 ;;
	-h | --help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
	*) echo "unknown argument: $a" >&2; exit 2 ;;
	esac
done
say() { [ "$quiet" = 1 ] || echo "[slurm-ci stop] $*"; }
warn() { echo "[slurm-ci stop] WARNING: $*" >&2; }

alive() { # a zombie counts as gone
	[ -r "/proc/$1/stat" ] || return 1
	local st; st=$(sed 's/.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f1)
	[ -n "$st" ] && [ "$st" != Z ]
}
pid_of() { # pid_of PIDFILE COMM -> pid, if the file names a live process running COMM
	local p
	[ -s "$1" ] || return 1
	p=$(tr -dc '0-9' <"$1")
	[ -n "$p" ] && alive "$p" && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = "$2" ] && echo "$p"
}
stop_pid() { # stop_pid PID LABEL: SIGTERM, wait up to 15 s, then SIGKILL
	local p=$1 what=$2 _i
	kill -TERM "$p" 2>/dev/null || return 0
	for _i in $(seq 1 60); do
		alive "$p" || { say "stopped $what (pid $p)"; return 0; }
		sleep 0.25
	done
	kill -KILL "$p" 2>/dev/null
	sleep 0.5
	warn "$what (pid $p) ignored SIGTERM for 15 s: sent SIGKILL"
}

# 1. cancel jobs while the controller is still up, so no slurmstepd is left behind
if pid_of "$RUN/slurmctld.pid" slurmctld >/dev/null; then
	ids=$(timeout 10 squeue -h -o '%i' 2>/dev/null | tr '\n' ' ')
	if [ -n "${ids// /}" ]; then
		say "cancelling jobs: $ids"
		# shellcheck disable=SC2086
		timeout 10 scancel $ids 2>/dev/null
		for _ in $(seq 1 60); do
			[ -z "$(timeout 10 squeue -h -o '%i' 2>/dev/null)" ] && break
			sleep 0.5
		done
		left=$(timeout 10 squeue -h -o '%i %T' 2>/dev/null | tr '\n' ' ')
		[ -z "$left" ] || warn "jobs still listed after 30 s: $left"
	fi
fi

# 2. slurmd instances, then the controller
for f in "$RUN"/slurmd-*.pid; do
	[ -e "$f" ] || continue
	n=$(basename "$f" .pid)
	if p=$(pid_of "$f" slurmd); then stop_pid "$p" "$n"; fi
done
if p=$(pid_of "$RUN/slurmctld.pid" slurmctld); then stop_pid "$p" slurmctld; fi

# 3. munged, only if we started it (start-local-slurm.sh copies its pid file into $RUN)
if [ -s "$RUN/munged.pid" ]; then
	if p=$(pid_of "$RUN/munged.pid" munged); then stop_pid "$p" munged; fi
fi

# 4. report (never kill) stray step daemons
strays=""
for d in /proc/[0-9]*; do
	[ "$(cat "$d/comm" 2>/dev/null)" = slurmstepd ] && alive "${d#/proc/}" && strays+=" ${d#/proc/}"
done
[ -z "$strays" ] || warn "slurmstepd still running (pids:$strays)"

# 5. /etc/hosts line (rewritten in place: /etc/hosts may be a bind mount)
if grep -qF "$MARK" /etc/hosts 2>/dev/null; then
	tmp=$(mktemp)
	grep -vF "$MARK" /etc/hosts >"$tmp"
	cat "$tmp" >/etc/hosts
	rm -f "$tmp"
	say "removed node names from /etc/hosts"
fi

# 6. state
if [ "$keep_state" = 0 ]; then
	rm -rf "$STATE" "$RUN"
	say "wiped $STATE and $RUN"
fi
if [ "$purge" = 1 ]; then
	for f in slurm.conf gres.conf; do
		if [ -f "$CONF_DIR/$f" ] && grep -qF "$MARK" "$CONF_DIR/$f"; then rm -f "$CONF_DIR/$f"; fi
		if [ -f "$CONF_DIR/$f.pre-slurm-ci" ] && [ ! -e "$CONF_DIR/$f" ]; then
			mv "$CONF_DIR/$f.pre-slurm-ci" "$CONF_DIR/$f"
		fi
	done
	rm -rf "$LOG"
	say "purged generated config and $LOG"
fi
exit 0
