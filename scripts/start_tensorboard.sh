#!/usr/bin/env bash
# Serve the TensorBoard event files of every run of the project in one TensorBoard.
#
#   bash scripts/start_tensorboard.sh                 # outputs/ and runs/ of the checkout, port 6006
#   bash scripts/start_tensorboard.sh outputs/ddp     # only these folders (any number)
#   PORT=6010 bash scripts/start_tensorboard.sh
#
# run_qa.py writes events to <output_dir>/runs/<time>_<host>/ (or --logging_dir; the job scripts use
# runs/<output folder name>, runs/<job name> by default). TensorBoard finds them recursively, one run
# per folder. On a cluster, start it on the login node and tunnel the port from your machine:
#   ssh -L 6006:localhost:6006 <login node>
# then open http://localhost:6006 (BIND=0.0.0.0 to listen on every interface instead).
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORT=${PORT:-6006}
BIND=${BIND:-localhost}

if [ -x "$REPO/.venv/bin/tensorboard" ]; then
	TB=("$REPO/.venv/bin/tensorboard")
elif command -v tensorboard >/dev/null 2>&1; then
	TB=(tensorboard)
else
	echo "ERROR: tensorboard not found (install it: pip install tensorboard, or bash setup_bert.sh)" >&2
	exit 2
fi

dirs=("$@")
if [ ${#dirs[@]} -eq 0 ]; then
	for d in "$REPO/outputs" "$REPO/runs"; do
		[ -d "$d" ] && dirs+=("$d")
	done
fi
if [ ${#dirs[@]} -eq 0 ]; then
	echo "ERROR: no outputs/ or runs/ under $REPO yet: run a job first, or name the folders to serve" >&2
	exit 2
fi

# name:path pairs so runs from different folders stay apart in the run list
spec=""
for d in "${dirs[@]}"; do
	[ -d "$d" ] || { echo "ERROR: $d is not a directory" >&2; exit 2; }
	abs=$(cd "$d" && pwd)
	spec+="${spec:+,}$(basename "$abs"):$abs"
done

count=$(find "${dirs[@]}" -name 'events.out.tfevents.*' 2>/dev/null | wc -l)
echo "TENSORBOARD serving $count event file(s) from: ${dirs[*]}"
echo "TENSORBOARD_URL=http://$BIND:$PORT"
if [ ${#dirs[@]} -eq 1 ]; then
	exec "${TB[@]}" --logdir "$(cd "${dirs[0]}" && pwd)" --port "$PORT" --host "$BIND"
fi
exec "${TB[@]}" --logdir_spec "$spec" --port "$PORT" --host "$BIND"
