# shellcheck shell=bash
# The set-up the bench scripts share: the checkout, the python, the real SQuAD files beside it.
# Source it from a bench script after `cd "$(dirname "$0")/.."`. Sets REPO, PY, SQUAD_DIR,
# TRAIN_FILE, DEV_FILE, HF_DIR and the offline environment; die() exits 2 with a message; require_squad checks the files
# exist, require_hf_script HF's run_qa.py;
# record_machine DIR keeps the MACHINE line (CPU model and flags, GPU, torch) with the results in DIR; measure_peaks DIR
# sets PEAK_ARGS, the GEMM peaks bench/side_by_side.py holds each run against.

REPO=$PWD
die() { echo "ERROR: $*" >&2; exit 2; }
PY=${PY:-$REPO/.venv/bin/python}
[[ $PY == /* ]] || PY=$REPO/$PY   # absolute (some steps run elsewhere); not resolved: a venv's python is a symlink
SQUAD_DIR=$(realpath -m "${SQUAD_DIR:-$REPO/../shared/data/squad-v1.1}")
TRAIN_FILE=$SQUAD_DIR/train-v1.1.first44articles.json
DEV_FILE=$SQUAD_DIR/dev-v1.1.json
HF_DIR=$(realpath -m "${HF_DIR:-$REPO/../shared/peers/hf_run_qa}")  # HF's own run_qa.py, utils_qa.py, squad metric
# every bench run is offline: the model is the pip package, the data the files above
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1

require_squad() {  # the files given (default: the train and dev files) must exist
	local f
	[ $# -gt 0 ] || set -- "$TRAIN_FILE" "$DEV_FILE"
	for f in "$@"; do
		[ -f "$f" ] || die "no $f: the real SQuAD v1.1 files are expected in ../shared/data/squad-v1.1 beside the checkout (or SQUAD_DIR=...)"
	done
}

require_hf_script() {  # HF's run_qa.py must be in HF_DIR
	[ -f "$HF_DIR/run_qa.py" ] ||
		die "no $HF_DIR/run_qa.py: HF's scripts are expected in ../shared/peers/hf_run_qa beside the checkout (or HF_DIR=...)"
}

record_machine() {  # DIR: the machine every result in DIR was measured on (figures of different CPUs never mix)
	mkdir -p "$1"
	"$PY" -m qa_hpc.plan --machine | tee "$1/machine.txt"
}

measure_peaks() {  # DIR: fp32 and bf16 GEMM peaks (bench/cpu_peak.py, unless CPU_PEAK_TFLOPS is given) as PEAK_ARGS
	local out
	if [ -z "${CPU_PEAK_TFLOPS:-}" ]; then
		out=$("$PY" -m bench.cpu_peak --json_out "$1/cpu_peak.json") || die "bench/cpu_peak.py failed"
		CPU_PEAK_TFLOPS=$(sed -n 's/^CPU_PEAK_TFLOPS=//p' <<<"$out")
		CPU_PEAK_BF16_TFLOPS=${CPU_PEAK_BF16_TFLOPS:-$(sed -n 's/^CPU_PEAK_BF16_TFLOPS=//p' <<<"$out")}
	fi
	echo "CPU_PEAK_TFLOPS=$CPU_PEAK_TFLOPS CPU_PEAK_BF16_TFLOPS=${CPU_PEAK_BF16_TFLOPS:-none} (GEMM peaks, bench/cpu_peak.py)"
	PEAK_ARGS=(--peak_tflops "$CPU_PEAK_TFLOPS")
	[ -z "${CPU_PEAK_BF16_TFLOPS:-}" ] || PEAK_ARGS+=(--peak_bf16_tflops "$CPU_PEAK_BF16_TFLOPS")
}
