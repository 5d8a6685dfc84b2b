#!/usr/bin/env bash
# Run a command with the CPU levers job_cpu.sh applies (scripts/env_setup.sh qa_cpu_levers), and nothing
# else of the job script (no demo fallback, no log copy): for side-by-side runs of plain run_qa.py.
#
#   QA_CPU_ALLOCATOR=jemalloc QA_CPU_AFFINITY=1 bash bench/with_cpu_levers.sh python run_qa.py ...
set -euo pipefail
[ $# -gt 0 ] || { echo "usage: [QA_CPU_ALLOCATOR=...] [QA_CPU_AFFINITY=...] bash $0 COMMAND..." >&2; exit 2; }
# shellcheck source=../scripts/env_setup.sh
source "$(dirname "$0")/../scripts/env_setup.sh"
qa_cpu_levers
exec "$@"
