#!/usr/bin/env bash
# Aux-loss-free balancing, measured (docs/model.md, "Routing"): the same small DeepSeek-V3-style MoE
# (sigmoid scores, top-2 of 8 experts in 4 groups, normalised weights, no auxiliary loss; layer 0
# dense, layer 1 MoE) trained 200 steps on the quick-start text twice from the same seed, with the
# expert bias update off and on (speed 0.01 per update: DeepSeek-V3's 0.001 was set for batches of
# millions of tokens; --set model.moe_bias_update_speed=... to change it). Prints, per run, the max/mean expert load (assignments of the
# busiest expert over the mean, 1 = balanced) averaged over the 200 steps and over the last 100.
# Needs the quick-start data (scripts/quickstart.sh prepares data/jargon_text_document).
#   scripts/moe_balance.sh [BUILD_DIR] [--set ...]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
args=(--config configs/moe_small.yaml --set model.num_layers=2 --set model.hidden_size=64
  --set model.ffn_hidden_size=172 --set model.moe_ffn_hidden_size=64 --set model.moe_first_k_dense_replace=1
  --set model.moe_aux_loss_coeff=0 --set model.moe_z_loss_coeff=0 --set model.moe_router_score_function=sigmoid
  --set model.moe_n_group=4 --set model.moe_topk_group=2 --set model.moe_norm_topk_prob=true
  --set model.moe_bias_update_speed=0.01
  --set parallel.expert=1 --set train.steps=200 --set train.log_interval=1 --set train.eval_interval=0
  --set train.micro_batch_size=4 --set train.global_batch_size=8 --set optimizer.warmup_steps=20)
for bias in false true; do
  OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$build/bin/pretrain_gpt" "${args[@]}" \
    --set model.moe_router_expert_bias=$bias --set train.output_dir="$out/$bias" "$@" >"$out/$bias.log" 2>&1 ||
    { tail -20 "$out/$bias.log"; exit 1; }
  grep -o '"moe_tokens_per_expert":\[[^]]*\]' "$out/$bias/metrics.jsonl" | grep -o '\[.*\]' | tr -d '[]' |
    awk -F, -v bias=$bias '{ m = 0; s = 0; for (i = 1; i <= NF; i++) { s += $i; if ($i > m) m = $i }
        r[NR] = m / (s / NF) }
      END { for (i = 1; i <= NR; i++) { all += r[i]; if (i > NR - 100) last += r[i] }
            printf "bias update %-5s: max/mean expert load %.3f over %d steps, %.3f over the last 100\n",
                   bias, all / NR, NR, last / 100 }'
  grep -o '"loss":[^,]*' "$out/$bias/metrics.jsonl" | tail -1 | sed "s/^/  final /"
done
