# shellcheck shell=bash
# The set-up the bench scripts share: the checkout, the python, the real SQuAD files beside it.
# Source it from a bench script after `cd "$(dirname "$0")/.."`. Sets REPO, PY, SQUAD_DIR,
# TRAIN_FILE, DEV_FILE and the offline environment; die() exits 2 with a message; require_squad checks the files exist.

REPO=$PWD
die() { echo "ERROR: $*" >&2; exit 2; }
PY=${PY:-$REPO/.venv/bin/python}
[[ $PY == /* ]] || PY=$REPO/$PY   # absolute (some steps run elsewhere); not resolved: a venv's python is a symlink
SQUAD_DIR=$(realpath -m "${SQUAD_DIR:-$REPO/../shared/data/squad-v1.1}")
TRAIN_FILE=$SQUAD_DIR/train-v1.1.first44articles.json
DEV_FILE=$SQUAD_DIR/dev-v1.1.json
# every bench run is offline: the model is the pip package, the data the files above
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONDONTWRITEBYTECODE=1

require_squad() {  # the files given (default: the train and dev files) must exist
	local f
	[ $# -gt 0 ] || set -- "$TRAIN_FILE" "$DEV_FILE"
	for f in "$@"; do
		[ -f "$f" ] || die "no $f: the real SQuAD v1.1 files are expected in ../shared/data/squad-v1.1 beside the checkout (or SQUAD_DIR=...)"
	done
}
