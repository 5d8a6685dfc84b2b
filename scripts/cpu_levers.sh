# shellcheck shell=bash
# Sourced by scripts/env_setup.sh (it needs qa_log and qa_die from there).

# ---- CPU levers (PyTorch CPU performance guide): a faster allocator and thread affinity ----------
# Each behind a switch, so a side-by-side measurement (bench/cpu_levers.sh) decides the defaults:
#   QA_CPU_ALLOCATOR=auto|jemalloc|tcmalloc|none   LD_PRELOAD the allocator when its library is on
#                    this machine (auto: jemalloc, else tcmalloc); a missing library is logged, never fatal.
#                    QA_CPU_ALLOCATOR_LIB=/path/lib.so uses that file instead of a search; QA_CPU_LIB_SEARCH=
#                    dir1:dir2 searches only there (default: ldconfig -p, then the usual lib folders).
#   QA_CPU_AFFINITY=1|0   pin the OpenMP threads: OMP_PROC_BIND=close OMP_PLACES=$QA_CPU_PLACES (threads).
#                    A user's own OMP_PROC_BIND / OMP_PLACES / GOMP_CPU_AFFINITY are kept.
# With binding on, OMP_NUM_THREADS is set to the CPUs the job may use (unless already set): libgomp pins
# the main thread to the first place as torch loads, so run_qa.py, reading its own affinity mask, would
# see one CPU and run one thread. Without binding, run_qa.py decides the thread count (README "How
# precision, threads and devices are chosen"). One greppable line says what was applied:
# CPU_LEVERS allocator=... affinity=...
QA_CPU_ALLOCATOR_DEFAULT=none   # flip after measuring (docs/PERFORMANCE.md "CPU levers")
QA_CPU_AFFINITY_DEFAULT=0

# The path of a shared library whose file name starts with $1 (e.g. libjemalloc.so), or nothing.
# ldconfig's cache first (what the dynamic linker itself finds), then the usual multiarch folders and
# a conda env, for machines whose cache is stale or where ldconfig is not on PATH. QA_CPU_LIB_SEARCH
# (folders, colon-separated) replaces both, e.g. a module's lib folder.
qa_find_lib() {
	local stem=$1 path dir dirs
	if [ -n "${QA_CPU_LIB_SEARCH:-}" ]; then
		IFS=: read -r -a dirs <<<"$QA_CPU_LIB_SEARCH"
	else
		path=$( (ldconfig -p 2>/dev/null || /sbin/ldconfig -p 2>/dev/null) | awk -v s="$stem" '$1 ~ "^"s {print $NF; exit}')
		if [ -n "$path" ] && [ -f "$path" ]; then echo "$path"; return 0; fi
		dirs=(/usr/lib/x86_64-linux-gnu /usr/lib/aarch64-linux-gnu /lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib
			${CONDA_PREFIX:+"$CONDA_PREFIX/lib"})
	fi
	for dir in "${dirs[@]}"; do
		for path in "$dir/$stem"*; do
			if [ -f "$path" ]; then echo "$path"; return 0; fi
		done
	done
	return 1
}

# Sets QA_ALLOCATOR_LIB (the library to preload, or empty) and QA_ALLOCATOR_NOTE (what happened).
qa_pick_allocator() {
	local want=${QA_CPU_ALLOCATOR:-$QA_CPU_ALLOCATOR_DEFAULT} name candidates=()
	QA_ALLOCATOR_LIB="" QA_ALLOCATOR_NOTE=""
	case $want in
	none) QA_ALLOCATOR_NOTE="none (QA_CPU_ALLOCATOR=none)"; return 0 ;;
	auto) candidates=(jemalloc tcmalloc) ;;
	jemalloc | tcmalloc) candidates=("$want") ;;
	*) qa_die "QA_CPU_ALLOCATOR=$want: use auto, jemalloc, tcmalloc or none" ;;
	esac
	if [ -n "${QA_CPU_ALLOCATOR_LIB:-}" ]; then
		[ -f "$QA_CPU_ALLOCATOR_LIB" ] || { QA_ALLOCATOR_NOTE="none (QA_CPU_ALLOCATOR_LIB=$QA_CPU_ALLOCATOR_LIB: no such file)"; return 0; }
		QA_ALLOCATOR_LIB=$QA_CPU_ALLOCATOR_LIB QA_ALLOCATOR_NOTE="$want($QA_CPU_ALLOCATOR_LIB)"; return 0
	fi
	for name in "${candidates[@]}"; do
		case $name in
		jemalloc) QA_ALLOCATOR_LIB=$(qa_find_lib libjemalloc.so) || true ;;
		tcmalloc) QA_ALLOCATOR_LIB=$(qa_find_lib libtcmalloc_minimal.so || qa_find_lib libtcmalloc.so) || true ;;
		esac
		if [ -n "$QA_ALLOCATOR_LIB" ]; then QA_ALLOCATOR_NOTE="$name($QA_ALLOCATOR_LIB)"; return 0; fi
	done
	local libs
	libs=$(printf 'lib%s or ' "${candidates[@]}")
	QA_ALLOCATOR_NOTE="none (QA_CPU_ALLOCATOR=$want: no ${libs% or } library found by ldconfig -p or in the usual lib folders;"
	QA_ALLOCATOR_NOTE+=" e.g. apt-get install libjemalloc2, or QA_CPU_ALLOCATOR_LIB=/path/libjemalloc.so.2)"
}

# Apply the levers to this shell's environment (the training process inherits it), and log the line.
qa_cpu_levers() {
	qa_pick_allocator
	if [ -n "$QA_ALLOCATOR_LIB" ]; then
		export LD_PRELOAD="$QA_ALLOCATOR_LIB${LD_PRELOAD:+:$LD_PRELOAD}"
	fi
	local affinity=${QA_CPU_AFFINITY:-$QA_CPU_AFFINITY_DEFAULT} note
	case $affinity in
	0) note="off (QA_CPU_AFFINITY=0)" ;;
	1)
		if [ -n "${OMP_PROC_BIND:-}${OMP_PLACES:-}${GOMP_CPU_AFFINITY:-}" ]; then
			note="kept the user's (OMP_PROC_BIND=${OMP_PROC_BIND:-} OMP_PLACES=${OMP_PLACES:-} GOMP_CPU_AFFINITY=${GOMP_CPU_AFFINITY:-})"
		else
			export OMP_PROC_BIND=close OMP_PLACES=${QA_CPU_PLACES:-threads}
			note="OMP_PROC_BIND=close,OMP_PLACES=$OMP_PLACES"
		fi
		if [ -z "${OMP_NUM_THREADS:-}" ]; then   # the mask before binding, capped by the job's CPUs
			OMP_NUM_THREADS=$(nproc)
			[ "${SLURM_CPUS_PER_TASK:-0}" -gt 0 ] 2>/dev/null && [ "$SLURM_CPUS_PER_TASK" -lt "$OMP_NUM_THREADS" ] &&
				OMP_NUM_THREADS=$SLURM_CPUS_PER_TASK
			export OMP_NUM_THREADS
		fi
		note+=",OMP_NUM_THREADS=$OMP_NUM_THREADS"
		;;
	*) qa_die "QA_CPU_AFFINITY=$affinity: use 1 or 0" ;;
	esac
	qa_log "CPU_LEVERS allocator=$QA_ALLOCATOR_NOTE affinity=$note"
}
