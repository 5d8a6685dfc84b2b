#!/usr/bin/env bash
# start-local-slurm.sh - a real single-host SLURM for the test suite (Debian/Ubuntu, no systemd).
#
#   munged + slurmctld + N x slurmd ("slurmd -N nodeI": one emulated node each, own port, all on
#   127.0.0.1), so tests can "sbatch --wait job_ft3.sh" and run a 2-node job_ddp.sh for real.
#   .ci/run starts it before pytest and stops it after; the test session starts it itself when none is
#   running and it may (root + apt: tests/fixtures/slurm_jobs.py), and the Slurm tests skip otherwise
#   (under CI=true they fail).
#
# Idempotent: stops a previous instance (stop-local-slurm.sh next to this file), wipes the cluster
# state, installs the packages only if missing, configures, starts, and waits until all nodes are
# idle. Must run as root; every daemon binds 127.0.0.1 only. On failure it prints the log tails
# and exits 1, leaving what it started running for inspection (pair it with stop-local-slurm.sh).
#
# Knobs (environment variables, all optional):
#   SLURM_CI_NODES=2            emulated nodes: node1..nodeN
#   SLURM_CI_CPUS=$(nproc)      CPUs advertised per node (may exceed the real cores)
#   SLURM_CI_MEM_MB=auto        RealMemory per node (default (MemTotal-1GiB)/NODES)
#   SLURM_CI_GPUS=0             fake gres/gpu per node (char devices, no real GPU behind them) so that
#                               "#SBATCH --gres=gpu:1" is accepted on a CPU-only machine
#   SLURM_CI_PARTITIONS=debug   space-separated partition names over all nodes; the first is default
#   SLURM_CI_NODE_PREFIX=node   node names ${PREFIX}1..${PREFIX}N
#   SLURM_CI_CTLD_PORT=6817     slurmctld port; SLURM_CI_SLURMD_PORT_BASE=17000 (node i: BASE+i)
#   SLURM_CI_MIN_JOB_AGE=4      seconds a finished job stays visible (<=5 keeps "sbatch --wait"
#                               polling every 2 s); "sacct -c" (job completion log) keeps them all
#   SLURM_CI_INSTALL=1          apt-get install the packages when missing (0: fail instead)
#   SLURM_CI_ETC_HOSTS=1        add "127.0.0.1 node1 .. nodeN" to /etc/hosts (marked line)
#   SLURM_CI_SMOKE=1            end with "srun -N NODES" across all nodes
#   SLURM_CI_TIMEOUT=60         seconds to wait for each daemon / for the nodes to become idle
#   SLURM_CI_TASK_PLUGIN=task/affinity  binds each task to its CPUs as real clusters do, so a step
#                               sees only the CPUs it was given (srun -c 1 nproc prints 1); task/none: all
set -euo pipefail

NODES=${SLURM_CI_NODES:-2}
CPUS=${SLURM_CI_CPUS:-$(nproc)}
GPUS=${SLURM_CI_GPUS:-0}
PARTITIONS=${SLURM_CI_PARTITIONS:-debug}
PFX=${SLURM_CI_NODE_PREFIX:-node}
CTLD_PORT=${SLURM_CI_CTLD_PORT:-6817}
PORT_BASE=${SLURM_CI_SLURMD_PORT_BASE:-17000}
MIN_JOB_AGE=${SLURM_CI_MIN_JOB_AGE:-4}
DO_INSTALL=${SLURM_CI_INSTALL:-1}
DO_HOSTS=${SLURM_CI_ETC_HOSTS:-1}
DO_SMOKE=${SLURM_CI_SMOKE:-1}
TMO=${SLURM_CI_TIMEOUT:-60}
TASK_PLUGIN=${SLURM_CI_TASK_PLUGIN:-task/affinity}

CONF_DIR=/etc/slurm
STATE=/var/spool/slurm-ci        # StateSaveLocation + per-node SlurmdSpoolDir
RUN=/run/slurm-ci                # pid files + "we started munged" marker
LOG=/var/log/slurm-ci            # daemon logs + jobcomp.log (kept by stop, for CI artifacts)
MARK="# slurm-ci-local"          # tags every file/line this recipe owns
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export PATH="/usr/sbin:/sbin:$PATH"

T0=$(date +%s.%N)
die() { say "ERROR: $*" >&2; exit 1; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN{printf "%.1f", b-a}'; }
say() { printf '[slurm-ci +%ss] %s\n' "$(elapsed "$T0")" "$*"; }
wait_for() {  # wait_for SECONDS DESCRIPTION CMD... : poll CMD every 0.5 s
	local t=$1; shift 2   # $2 only documents what we wait for
	local end=$(( $(date +%s) + t ))
	until "$@" >/dev/null 2>&1; do
		[ "$(date +%s)" -lt "$end" ] || return 1
		sleep 0.5
	done
}

[ "$(id -u)" = 0 ] || die "must run as root"
for v in NODES CPUS GPUS CTLD_PORT PORT_BASE MIN_JOB_AGE TMO; do
	[[ "${!v}" =~ ^[0-9]+$ ]] || die "$v=${!v}: must be a non-negative integer"
done
[ "$NODES" -ge 1 ] && [ "$CPUS" -ge 1 ] || die "need at least 1 node and 1 CPU"

# ---------------------------------------------------------------- 0. stop a previous instance
if [ -x "$HERE/stop-local-slurm.sh" ] || [ -f "$HERE/stop-local-slurm.sh" ]; then
	bash "$HERE/stop-local-slurm.sh" --quiet || true
fi

# ---------------------------------------------------------------- 1. install (only if missing)
PKGS="munge slurmctld slurmd slurm-client"
BINS="/usr/sbin/slurmctld /usr/sbin/slurmd /usr/sbin/slurmstepd /usr/bin/sbatch /usr/bin/srun
	/usr/bin/scontrol /usr/sbin/munged /usr/bin/munge"
need_install() {
	local b
	for b in $BINS; do [ -x "$b" ] || return 0; done
	return 1
}
if need_install; then
	[ "$DO_INSTALL" = 1 ] || die "Slurm/munge not installed and SLURM_CI_INSTALL=0"
	t=$(date +%s.%N)
	# Keep the packages' maintainer scripts from starting munged/slurmd themselves via
	# /etc/init.d when there is no policy-rc.d (Debian containers usually have one).
	policy_added=0
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\n%s\nexit 101\n' "$MARK" >/usr/sbin/policy-rc.d
		chmod 0755 /usr/sbin/policy-rc.d
		policy_added=1
	fi
	trap '[ "$policy_added" = 1 ] && rm -f /usr/sbin/policy-rc.d' EXIT
	export DEBIAN_FRONTEND=noninteractive
	aptlog=$(mktemp /tmp/slurm-ci-apt.XXXXXX)
	# shellcheck disable=SC2086
	{ apt-get update && apt-get install -y --no-install-recommends -o Dpkg::Use-Pty=0 $PKGS; } \
		>"$aptlog" 2>&1 ||
		{ tail -n 40 "$aptlog" >&2; die "apt-get failed (full log: $aptlog)"; }
	rm -f "$aptlog"
	[ "$policy_added" = 1 ] && rm -f /usr/sbin/policy-rc.d
	trap - EXIT
	need_install && die "packages installed but binaries still missing"
	say "installed $PKGS ($(dpkg-query -W -f='${Version}' slurmctld)) in $(elapsed "$t")s"
fi
getent passwd munge >/dev/null || die "user 'munge' missing (munge package broken?)"

# ---------------------------------------------------------------- 2. munge
rm -rf "$LOG"                   # logs of the previous run (job ids restart at 1)
install -d -m 0755 "$RUN" "$LOG"
install -d -o munge -g munge -m 0700 /etc/munge /var/log/munge
install -d -o munge -g munge -m 0711 /var/lib/munge
install -d -o munge -g munge -m 0755 /run/munge
if [ ! -s /etc/munge/munge.key ]; then
	# Debian's munge postinst normally creates it; a single host only needs *a* key.
	mungekey --create --keyfile=/etc/munge/munge.key 2>/dev/null ||
		dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none
	say "created /etc/munge/munge.key"
fi
chown munge:munge /etc/munge/munge.key
chmod 0400 /etc/munge/munge.key
if munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
	say "munged already running (not started by us): reusing it"
else
	runuser -u munge -- /usr/sbin/munged </dev/null >>"$LOG/munged.stdout" 2>&1 ||
		{ tail -n 20 /var/log/munge/munged.log >&2; die "munged failed to start"; }
	wait_for "$TMO" munge sh -c 'munge -n | unmunge' ||
		{ tail -n 20 /var/log/munge/munged.log >&2; die "munged not answering"; }
	cp /run/munge/munged.pid "$RUN/munged.pid"     # marker: we own this munged
	say "munged started (pid $(cat "$RUN/munged.pid"))"
fi

# ---------------------------------------------------------------- 3. configuration
mem_total=$(awk '/^MemTotal:/{print int($2/1024)}' /proc/meminfo)
MEM=${SLURM_CI_MEM_MB:-$(( (mem_total - 1024) / NODES ))}
[ "$MEM" -ge 100 ] || MEM=100
NODE_NAMES=""
for i in $(seq 1 "$NODES"); do NODE_NAMES+="${NODE_NAMES:+ }${PFX}${i}"; done

install -d -m 0755 "$CONF_DIR"
for f in slurm.conf gres.conf; do   # keep a foreign config, once
	if [ -f "$CONF_DIR/$f" ] && ! grep -qF "$MARK" "$CONF_DIR/$f" && [ ! -e "$CONF_DIR/$f.pre-slurm-ci" ]; then
		mv "$CONF_DIR/$f" "$CONF_DIR/$f.pre-slurm-ci"
		say "moved existing $CONF_DIR/$f to $f.pre-slurm-ci"
	fi
done

{
	echo "$MARK  (generated by start-local-slurm.sh; do not edit)"
	cat <<EOF
ClusterName=ci
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d/%n
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
ProctrackType=proctrack/linuxproc
TaskPlugin=$TASK_PLUGIN
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SlurmdParameters=config_overrides
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
MinJobAge=$MIN_JOB_AGE
KillWait=5
InactiveLimit=0
SlurmdTimeout=120
SlurmctldTimeout=120
JobCompType=jobcomp/filetxt
JobCompLoc=$LOG/jobcomp.log
EOF
	echo "AccountingStorageType=accounting_storage/none"
	echo "JobAcctGatherType=jobacct_gather/none"
	[ "$GPUS" -gt 0 ] && echo "GresTypes=gpu"
	for i in $(seq 1 "$NODES"); do
		gres=""; [ "$GPUS" -gt 0 ] && gres=" Gres=gpu:$GPUS"
		echo "NodeName=${PFX}${i} NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((PORT_BASE + i)) CPUs=$CPUS RealMemory=$MEM$gres State=UNKNOWN"
	done
	first=1
	for p in $PARTITIONS; do
		def=NO; [ "$first" = 1 ] && def=YES; first=0
		echo "PartitionName=$p Nodes=ALL Default=$def MaxTime=INFINITE State=UP"
	done
} >"$CONF_DIR/slurm.conf"
chmod 0644 "$CONF_DIR/slurm.conf"

# Fresh state every time (the stop script normally wiped it already).
rm -rf "$STATE"
install -d -m 0755 "$STATE" "$STATE/ctld" "$STATE/d"
for n in $NODE_NAMES; do install -d -m 0755 "$STATE/d/$n"; done

if [ "$GPUS" -gt 0 ]; then
	# gres/gpu in 22.05 counts only GPUs that have a File=; Count= alone is reported as 0 and
	# the node is drained ("gres/gpu count reported lower than configured (0 < 1)").  A plain
	# file is accepted but logs "is not a valid character or block device" and leaves
	# CUDA_VISIBLE_DEVICES empty.  So each fake GPU gets a char device: a copy of /dev/null
	# (mknod c 1 3) or, where mknod is not permitted, one of the harmless existing ones.
	# Jobs then get CUDA_VISIBLE_DEVICES=0,1.. as usual; no real GPU is behind it.
	install -d -m 0755 "$STATE/fakegpu"
	files=""
	for g in $(seq 0 $((GPUS - 1))); do
		if mknod -m 0666 "$STATE/fakegpu/gpu$g" c 1 3 2>/dev/null; then
			files+="${files:+,}$STATE/fakegpu/gpu$g"
		else
			set -- /dev/null /dev/zero /dev/full /dev/random /dev/urandom
			[ "$GPUS" -le $# ] || die "mknod not permitted: at most $# fake GPUs per node"
			shift "$g"; files+="${files:+,}$1"
		fi
	done
	{ echo "$MARK"; echo "AutoDetect=off"; echo "Name=gpu File=$files"; } >"$CONF_DIR/gres.conf"
elif [ -f "$CONF_DIR/gres.conf" ] && grep -qF "$MARK" "$CONF_DIR/gres.conf"; then
	rm -f "$CONF_DIR/gres.conf"
fi

# Node names must resolve for job scripts (torchrun rendezvous on the first node, etc.);
# `hostname -i` must work too.  Rewrite /etc/hosts in place (it may be a bind mount).
if [ "$DO_HOSTS" = 1 ]; then
	extra=""
	getent hosts "$(hostname)" >/dev/null 2>&1 || extra=" $(hostname)"
	tmp=$(mktemp)
	grep -vF "$MARK" /etc/hosts >"$tmp" || true
	echo "127.0.0.1 $NODE_NAMES$extra $MARK" >>"$tmp"
	cat "$tmp" >/etc/hosts
	rm -f "$tmp"
fi

# ---------------------------------------------------------------- 4. daemons
t=$(date +%s.%N)
/usr/sbin/slurmctld </dev/null >>"$LOG/slurmctld.stdout" 2>&1 ||
	{ tail -n 30 "$LOG/slurmctld.log" "$LOG/slurmctld.stdout" >&2 || true; die "slurmctld failed to start"; }
wait_for "$TMO" slurmctld sh -c 'scontrol ping | grep -q "is UP"' ||
	{ tail -n 30 "$LOG/slurmctld.log" >&2 || true; die "slurmctld not answering on localhost:$CTLD_PORT"; }
say "slurmctld up (pid $(cat "$RUN/slurmctld.pid")) in $(elapsed "$t")s"

t=$(date +%s.%N)
for n in $NODE_NAMES; do
	/usr/sbin/slurmd -N "$n" </dev/null >>"$LOG/slurmd-$n.stdout" 2>&1 ||
		{ tail -n 30 "$LOG/slurmd-$n.log" "$LOG/slurmd-$n.stdout" >&2 || true; die "slurmd -N $n failed to start"; }
done
all_idle() {
	local out
	out=$(sinfo -h -N -o '%N %t' | sort -u) || return 1
	[ "$(echo "$out" | grep -c ' idle$')" -eq "$NODES" ]
}
if ! wait_for "$TMO" nodes all_idle; then
	sinfo -N -l >&2 || true
	scontrol show nodes | grep -E 'NodeName|State|Reason' >&2 || true
	for n in $NODE_NAMES; do tail -n 15 "$LOG/slurmd-$n.log" >&2 || true; done
	die "nodes did not become idle within ${TMO}s"
fi
say "$NODES slurmd up and idle in $(elapsed "$t")s: $(sinfo -h -o '%P %D %t %N' | tr '\n' ';')"

# ---------------------------------------------------------------- 5. smoke test
if [ "$DO_SMOKE" = 1 ]; then
	t=$(date +%s.%N)
	out=$(timeout "$TMO" srun -N "$NODES" --ntasks-per-node=1 -t 1 \
		bash -c 'echo "$SLURMD_NODENAME/$SLURM_PROCID"' 2>&1) ||
		{ echo "$out" >&2; die "smoke test srun failed"; }
	say "smoke test ok in $(elapsed "$t")s: $(echo "$out" | sort | tr '\n' ' ')"
fi
say "Slurm ready: $NODES node(s) [$NODE_NAMES], partitions [$PARTITIONS], conf $CONF_DIR/slurm.conf, logs $LOG"
