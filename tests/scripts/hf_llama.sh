#!/usr/bin/env bash
# Hugging Face model folders through convert_checkpoint and the trainer, against the PyTorch
# reference of tests/reference/make_hf_llama.py (Llama-, Mistral- and Qwen2-shaped tiny models: GQA,
# rope theta != 10000, untied and tied embeddings, Qwen2's q/k/v biases, Llama 3.1's rope_scaling;
# 3 AdamW steps) and the folders transformers 5 saved in tests/reference/make_hf_transformers5.py
# (config.json with rope_parameters and dtype; losses and weights computed by transformers itself),
# and make_hf_qwen3.py's Qwen3 (qk-norm, head_dim != hidden / heads), Qwen3-MoE (norm_topk_prob false
# and true) and Mixtral (top-k renormalised), saved and trained by transformers,
# make_hf_yarn.py's YaRN-scaled Qwen2 (rope_parameters yarn; saved and trained by transformers),
# and make_hf_deepseek_v3.py's DeepSeek-V3 (latent attention with rope_interleave, yarn with mscale,
# sigmoid group-limited routing with the expert bias updated as our trainer does, a shared expert,
# the first layer dense; its transformers-4.57 config too; its MTP layer: hf_deepseek_v3_mtp.sh):
#  1. each model: --from hf -> pretrain_gpt --config CKPT.yaml --set checkpoint.load=CKPT on one rank
#     and on tp2 x pp2 (4 ranks; the MoE ones tp2 x pp2 x ep2, DeepSeek-V3 on 8 ranks with dp2) -> its losses equal the reference's (relative 1e-5) -> --to hf ->
#     the folder's weights equal the reference's after the steps (hf_compare's tolerance), and its
#     config.json names the architecture the model came from (Mistral keeps sliding_window);
#  2. the bf16 sharded folder imports; exported as f32 it holds the same values; exported as bf16
#     with --max-shard-size it is sharded again, holds the same bits and imports again;
#  3. the GPT-2 fixture as a folder (--from hf) gives back the same tensors;
#  4. config.json / folder errors end convert_checkpoint with exit 1 and one line naming the key or
#     tensor (the library-level cases are in tests/unit/test_hf_model.cpp): among them a key that
#     changes the model and that the key table does not know, rope_theta given twice with two values,
#     and num_hidden_layers 1e9 (refused at once, not after building 1e9 layers); the export's
#     refusal of the router options Qwen3-MoE and Mixtral cannot hold (sigmoid, scaling, groups, ...).
#   hf_llama.sh SOURCE_DIR CONVERT_CHECKPOINT PRETRAIN_GPT HF_COMPARE MPIEXEC...
set -euo pipefail
src=$1 convert=$2 pretrain=$3 compare=$4
shift 4
mpiexec=("$@")
fx=$src/tests/reference/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn

# What make_hf_llama.py trains: seq 8, batch 2, 3 steps of AdamW (lr 1e-2, betas 0.9/0.95, decay
# 0.1 on matrices), constant lr, no clipping, on the unshuffled token document.
train=(--set model.seq_length=8 --set train.global_batch_size=2 --set train.micro_batch_size=1
  --set train.steps=3 --set train.log_interval=1 --set train.eval_interval=0
  --set data.path="$fx/hf_tokens_text_document" --set data.split=1,0,0 --set data.shuffle=false
  --set optimizer.lr=0.01 --set optimizer.lr_decay=constant --set optimizer.warmup_steps=0
  --set optimizer.weight_decay=0.1 --set optimizer.beta1=0.9 --set optimizer.beta2=0.95
  --set optimizer.eps=1e-8 --set optimizer.clip_grad=0 --set model.dropout=0)

# quiet and expect_error.
# shellcheck source=convert_common.sh
source "$(dirname "${BASH_SOURCE[0]}")/convert_common.sh"

# 1. Train each model on one rank and on tp2 x pp2; export; compare. FOLDER:AFTER3: the folder
# tests/reference/fixtures/hf_FOLDER and the reference hf_AFTER3_after3.safetensors. mistral_t5 and
# qwen2_t5 are transformers 5's config.json with the make_hf_llama.py weights (copied in), trained
# on one rank only (their layouts are those of mistral_tiny and qwen2_tiny).
for m in llama_tiny:llama_tiny mistral_tiny:mistral_tiny qwen2_tiny:qwen2_tiny llama3_tiny:llama3_tiny \
  llama_t5:llama_t5 llama3_t5:llama3_t5 mistral_t5:mistral_tiny qwen2_t5:qwen2_tiny \
  mistral_window_tiny:mistral_window_tiny qwen2_window_tiny:qwen2_window_tiny qwen3_tiny:qwen3_tiny \
  qwen3_moe_tiny:qwen3_moe_tiny qwen3_moe_norm_tiny:qwen3_moe_norm_tiny mixtral_tiny:mixtral_tiny \
  qwen2_yarn_t5:qwen2_yarn_t5 deepseek_v3_tiny:deepseek_v3_tiny deepseek_v3_t4:deepseek_v3_tiny; do
  model=${m%%:*} after3=$fx/hf_${m#*:}_after3.safetensors
  dir=$work/$model
  mkdir -p "$dir"
  src_dir=$fx/hf_$model
  if [[ ! -e $src_dir/model.safetensors ]]; then
    mkdir -p "$dir/in" && cp "$src_dir/config.json" "$dir/in/" && cp "$fx/hf_${m#*:}/model.safetensors" "$dir/in/"
    src_dir=$dir/in
  fi
  quiet "$dir/import.log" "$convert" --from hf --input "$src_dir" --output "$dir/ckpt"
  [[ -s $dir/ckpt.yaml ]] || { echo "$model: no ckpt.yaml"; exit 1; }
  layouts=("1 1 1" "4 2 2")
  [[ $model == mistral_t5 || $model == qwen2_t5 || $model == deepseek_v3_t4 ]] && layouts=("1 1 1")
  # Sliding windows smaller than the sequence: one rank and tp2 x cp2 (the ring skips the blocks
  # outside the window).
  [[ $model == *_window_tiny ]] && layouts=("1 1 1" "4 2 1 2")
  # Experts: tp2 x pp2 x ep2 (tp with MoE needs sequence parallelism).
  [[ $model == *_moe_tiny || $model == *_moe_norm_tiny || $model == mixtral_tiny ]] && layouts=("1 1 1" "4 2 2 1 2")
  # DeepSeek-V3: tp2 x pp2 x ep2 with dp2 (the expert bias's loads summed over dp and tp).
  [[ $model == deepseek_v3_tiny ]] && layouts=("1 1 1" "8 2 2 1 2")
  # Qwen3's qk-norm weights (gradients summed over tp) under tp2 x dp2 with ZeRO-3 too.
  [[ $model == qwen3_tiny ]] && layouts=("1 1 1" "4 2 2" "4 2 1 1 1 optim_grads_params")
  for layout in "${layouts[@]}"; do
    read -r ranks tp pp cp ep sharding <<<"$layout"
    cp=${cp:-1} ep=${ep:-1} sharding=${sharding:-none}
    run=$dir/tp${tp}pp${pp}
    [[ $cp == 1 ]] || run=$dir/tp${tp}cp${cp}
    [[ $ep == 1 ]] || run=$dir/tp${tp}pp${pp}ep${ep}
    [[ $sharding == none ]] || run=$dir/tp${tp}dp$((ranks / (tp * pp * cp)))_$sharding
    quiet "$run.log" "${mpiexec[@]}" -np "$ranks" "$pretrain" --config "$dir/ckpt.yaml" \
      --set checkpoint.load="$dir/ckpt" --set checkpoint.dir="$run/ckpt" --set train.output_dir="$run" \
      --set parallel.tensor="$tp" --set parallel.pipeline="$pp" --set parallel.context="$cp" \
      --set parallel.expert="$ep" --set parallel.sequence_parallel="$([[ $ep == 1 ]] && echo false || echo true)" \
      --set optimizer.sharding="$sharding" \
      "${train[@]}"
    quiet "$run.export.log" "$convert" --to hf --input "$run/ckpt" --output "$run/hf"
    echo -n "$model tp$tp pp$pp cp$cp ep$ep $sharding: "
    "$compare" losses "$run/metrics.jsonl" "$after3"
    echo -n "$model tp$tp pp$pp cp$cp ep$ep $sharding: "
    "$compare" weights "$run/hf" "$after3"
  done
  # The export (no template) names the architecture and model_type of the folder it came from.
  for key in architectures model_type; do
    want=$(tr -d ' \n' <"$src_dir/config.json" | grep -o "\"$key\":[^,]*" | head -1)
    tr -d ' \n' <"$dir/tp1pp1/hf/config.json" | grep -qF -- "$want" ||
      { echo "$model: the export lost $want"; cat "$dir/tp1pp1/hf/config.json"; exit 1; }
  done
  # transformers 5's layout, plus 4.x's names of the same values.
  for key in '"dtype": "float32"' '"torch_dtype": "float32"' '"rope_parameters": {'; do
    grep -qF -- "$key" "$dir/tp1pp1/hf/config.json" || { echo "$model: the export lacks $key"; exit 1; }
  done
done
# DeepSeek-V3: latent attention, rope_interleave, yarn with mscale, DeepSeek's routing and experts,
# read into model.* and written back under DeepseekV3Config's keys; the 4.57 layout reads as the same model.
for want in 'attention: mla' 'q_lora_rank: 12' 'kv_lora_rank: 12' 'qk_nope_head_dim: 8' 'qk_rope_head_dim: 4' \
  'v_head_dim: 6' 'hf_rope_interleave: true' 'rope_scaling: yarn' 'rope_mscale_all_dim: 0.8' 'num_experts: 8' \
  'moe_ffn_hidden_size: 8' 'moe_shared_expert_ffn_hidden_size: 8' 'moe_router_score_function: sigmoid' \
  'moe_norm_topk_prob: true' 'moe_routed_scaling_factor: 2.5' 'moe_n_group: 4' 'moe_topk_group: 2' \
  'moe_router_expert_bias: true' 'moe_first_k_dense_replace: 1' 'ffn_hidden_size: 32'; do
  grep -qx "  $want" "$work/deepseek_v3_tiny/ckpt.yaml" || { echo "deepseek_v3: ckpt.yaml lacks $want"; cat "$work/deepseek_v3_tiny/ckpt.yaml"; exit 1; }
done
for want in '"rope_interleave": true' '"q_lora_rank": 12' '"kv_lora_rank": 12' '"qk_head_dim": 12' '"head_dim": 4' \
  '"v_head_dim": 6' '"n_routed_experts": 8' '"n_shared_experts": 1' '"moe_intermediate_size": 8' '"n_group": 4' \
  '"topk_group": 2' '"routed_scaling_factor": 2.5' '"norm_topk_prob": true' '"first_k_dense_replace": 1' \
  '"num_nextn_predict_layers": 0' '"mscale_all_dim": 0.8' '"intermediate_size": 32' '"model_type": "deepseek_v3"'; do
  grep -qF -- "$want" "$work/deepseek_v3_tiny/tp1pp1/hf/config.json" ||
    { echo "deepseek_v3: the export lacks $want"; cat "$work/deepseek_v3_tiny/tp1pp1/hf/config.json"; exit 1; }
done
diff <(grep -v '^#' "$work/deepseek_v3_tiny/ckpt.yaml") <(grep -v '^#' "$work/deepseek_v3_t4/ckpt.yaml") ||
  { echo "deepseek_v3: transformers 4.57's config.json reads as another model"; exit 1; }
# DeepSeek's multi-token prediction layer: hf_deepseek_v3_mtp.sh.
# Qwen3 (make_hf_qwen3.py, saved and trained by transformers 5): qk-norm and head_dim 8 != 24 / 4.
grep -q 'qk_norm: true' "$work/qwen3_tiny/ckpt.yaml" && grep -q 'head_dim: 8' "$work/qwen3_tiny/ckpt.yaml" &&
  grep -q '"head_dim": 8' "$work/qwen3_tiny/tp1pp1/hf/config.json" ||
  { echo "qwen3: qk_norm / head_dim did not round-trip"; cat "$work/qwen3_tiny/ckpt.yaml"; exit 1; }
grep -q 'num_experts: 4' "$work/qwen3_moe_tiny/ckpt.yaml" && grep -q 'moe_ffn_hidden_size: 16' "$work/qwen3_moe_tiny/ckpt.yaml" &&
  grep -q '"num_local_experts": 4' "$work/qwen3_moe_tiny/tp1pp1/hf/config.json" &&
  grep -q '"norm_topk_prob": false' "$work/qwen3_moe_tiny/tp1pp1/hf/config.json" ||
  { echo "qwen3_moe: the experts did not round-trip"; cat "$work/qwen3_moe_tiny/tp1pp1/hf/config.json"; exit 1; }
# norm_topk_prob true: model.moe_norm_topk_prob, written back.
grep -q 'moe_norm_topk_prob: true' "$work/qwen3_moe_norm_tiny/ckpt.yaml" &&
  grep -q '"norm_topk_prob": true' "$work/qwen3_moe_norm_tiny/tp1pp1/hf/config.json" ||
  { echo "qwen3_moe_norm: norm_topk_prob did not round-trip"; cat "$work/qwen3_moe_norm_tiny/tp1pp1/hf/config.json"; exit 1; }
# Mixtral: experts intermediate_size wide, top-k renormalised; MixtralConfig's keys written back.
grep -q 'moe_norm_topk_prob: true' "$work/mixtral_tiny/ckpt.yaml" && grep -q 'moe_ffn_hidden_size: 16' "$work/mixtral_tiny/ckpt.yaml" &&
  grep -q '"num_local_experts": 4' "$work/mixtral_tiny/tp1pp1/hf/config.json" &&
  grep -q '"num_experts_per_tok": 2' "$work/mixtral_tiny/tp1pp1/hf/config.json" &&
  grep -q '"intermediate_size": 16' "$work/mixtral_tiny/tp1pp1/hf/config.json" &&
  grep -q '"router_jitter_noise": 0.0' "$work/mixtral_tiny/tp1pp1/hf/config.json" &&
  grep -q '"sliding_window": null' "$work/mixtral_tiny/tp1pp1/hf/config.json" ||
  { echo "mixtral: the experts did not round-trip"; cat "$work/mixtral_tiny/tp1pp1/hf/config.json"; exit 1; }
grep -q 'add_qkv_bias: true' "$work/qwen2_tiny/ckpt.yaml" || { echo "qwen2: ckpt.yaml lacks add_qkv_bias"; exit 1; }
grep -q 'rope_theta: 1000000' "$work/mistral_tiny/ckpt.yaml" || { echo "mistral: ckpt.yaml lacks rope_theta"; exit 1; }
grep -q 'rope_scaling: llama3' "$work/llama3_tiny/ckpt.yaml" && grep -q 'rope_high_freq_factor: 32' "$work/llama3_tiny/ckpt.yaml" ||
  { echo "llama3: ckpt.yaml lacks rope_scaling"; exit 1; }
grep -q '"rope_type": "llama3"' "$work/llama3_tiny/tp1pp1/hf/config.json" &&
  grep -q '"original_max_position_embeddings": 256' "$work/llama3_tiny/tp1pp1/hf/config.json" ||
  { echo "llama3: exported config.json lacks rope_scaling"; cat "$work/llama3_tiny/tp1pp1/hf/config.json"; exit 1; }
# YaRN: imported as model.rope_scaling = yarn with its keys, exported in transformers 5's layout.
grep -q 'rope_scaling: yarn' "$work/qwen2_yarn_t5/ckpt.yaml" && grep -q 'rope_original_max_position_embeddings: 16' \
  "$work/qwen2_yarn_t5/ckpt.yaml" && grep -q 'rope_beta_fast: 32' "$work/qwen2_yarn_t5/ckpt.yaml" ||
  { echo "qwen2_yarn_t5: ckpt.yaml lacks rope_scaling"; cat "$work/qwen2_yarn_t5/ckpt.yaml"; exit 1; }
tr -d ' \n' <"$work/qwen2_yarn_t5/tp1pp1/hf/config.json" | grep -qF '"rope_parameters":{"beta_fast":32.0,"beta_slow":1.0,"factor":4.0,"original_max_position_embeddings":16,"rope_theta":10.0,"rope_type":"yarn"}' ||
  { echo "qwen2_yarn_t5: exported rope_parameters differ from transformers 5's"; cat "$work/qwen2_yarn_t5/tp1pp1/hf/config.json"; exit 1; }
# transformers 5's folders: their real rope_theta (rope_parameters), scaling and window.
grep -q 'rope_theta: 500000' "$work/llama_t5/ckpt.yaml" || { echo "llama_t5: ckpt.yaml lacks rope_theta 500000"; exit 1; }
grep -q 'rope_scaling: llama3' "$work/llama3_t5/ckpt.yaml" && grep -q 'rope_original_max_position_embeddings: 256' \
  "$work/llama3_t5/ckpt.yaml" || { echo "llama3_t5: ckpt.yaml lacks rope_scaling"; exit 1; }
# The windows: imported as model.sliding_window (Qwen2: with max_window_layers), exported back.
grep -q 'sliding_window: 3' "$work/mistral_window_tiny/ckpt.yaml" &&
  grep -q '"sliding_window": 3' "$work/mistral_window_tiny/tp1pp1/hf/config.json" ||
  { echo "mistral_window: the window did not round-trip"; exit 1; }
grep -q 'sliding_window: 3' "$work/qwen2_window_tiny/ckpt.yaml" && grep -q 'max_window_layers: 1' "$work/qwen2_window_tiny/ckpt.yaml" &&
  grep -q '"use_sliding_window": true' "$work/qwen2_window_tiny/tp1pp1/hf/config.json" &&
  grep -q '"sliding_attention"' "$work/qwen2_window_tiny/tp1pp1/hf/config.json" ||
  { echo "qwen2_window: the window did not round-trip"; cat "$work/qwen2_window_tiny/tp1pp1/hf/config.json"; exit 1; }
# Mistral round trip without a template: MistralForCausalLM and its sliding_window are kept.
for model in mistral_tiny mistral_t5; do
  grep -q 'sliding_window: 4096' "$work/$model/ckpt.yaml" && grep -q 'hf_architecture: "MistralForCausalLM"' \
    "$work/$model/ckpt.yaml" || { echo "$model: ckpt.yaml lacks sliding_window / hf_architecture"; exit 1; }
  grep -q '"MistralForCausalLM"' "$work/$model/tp1pp1/hf/config.json" && grep -q '"sliding_window": 4096' \
    "$work/$model/tp1pp1/hf/config.json" || { echo "$model: round trip lost Mistral"; cat "$work/$model/tp1pp1/hf/config.json"; exit 1; }
done

# With the original config.json as a template, the export keeps its architecture and other keys.
quiet "$work/template.log" "$convert" --to hf --input "$work/mistral_tiny/tp1pp1/ckpt" --output "$work/mistral_templ" \
  --hf-config "$fx/hf_mistral_tiny/config.json"
grep -q '"MistralForCausalLM"' "$work/mistral_templ/config.json" && grep -q '"sliding_window": 4096' \
  "$work/mistral_templ/config.json" || { echo "template keys lost"; cat "$work/mistral_templ/config.json"; exit 1; }

# 2. bf16, sharded.
bf16=$fx/hf_llama_tiny_bf16
quiet "$work/bf16.log" "$convert" --from hf --input "$bf16" --output "$work/bf16/ckpt"
quiet "$work/bf16_f32.log" "$convert" --to hf --input "$work/bf16/ckpt" --output "$work/bf16/f32"
echo -n "bf16 import, f32 export: "
"$compare" equal "$work/bf16/f32" "$bf16"
grep -q '"torch_dtype": "float32"' "$work/bf16/f32/config.json" || { echo "f32 export: torch_dtype"; exit 1; }
[[ -f $work/bf16/f32/model.safetensors && ! -e $work/bf16/f32/model.safetensors.index.json ]] ||
  { echo "a small export must be one model.safetensors"; exit 1; }
quiet "$work/bf16_sharded.log" "$convert" --to hf --input "$work/bf16/ckpt" --output "$work/bf16/sharded" \
  --dtype bf16 --max-shard-size 8KB
shards=$(find "$work/bf16/sharded" -name 'model-0000*-of-0000*.safetensors' | wc -l)
((shards >= 2)) && [[ -s $work/bf16/sharded/model.safetensors.index.json && ! -e $work/bf16/sharded/model.safetensors ]] ||
  { echo "--max-shard-size 8KB wrote $shards shards"; ls "$work/bf16/sharded"; exit 1; }
echo -n "bf16 export in $shards shards: "
"$compare" equal "$work/bf16/sharded" "$bf16"
quiet "$work/bf16_again.log" "$convert" --from hf --input "$work/bf16/sharded" --output "$work/bf16/again"

# 3. GPT-2 as a folder.
mkdir -p "$work/gpt2"
cp "$fx/hf_gpt2_tiny.safetensors" "$work/gpt2/model.safetensors"
cp "$fx/hf_gpt2_tiny_config.json" "$work/gpt2/config.json"
quiet "$work/gpt2.log" "$convert" --from hf --input "$work/gpt2" --output "$work/gpt2_ckpt"
quiet "$work/gpt2_out.log" "$convert" --to hf --input "$work/gpt2_ckpt" --output "$work/gpt2_out"
echo -n "GPT-2 folder round trip: "
"$compare" equal "$work/gpt2_out" "$work/gpt2" --subset
grep -q '"GPT2LMHeadModel"' "$work/gpt2_out/config.json" || { echo "GPT-2 exported as another architecture"; exit 1; }

# 4. One-line errors (expect_error, convert_common.sh).
variant() {  # variant NAME SED_EXPR: a copy of the llama fixture with its config.json edited
  mkdir -p "$work/$1"
  cp "$fx/hf_llama_tiny/model.safetensors" "$work/$1/"
  sed "$2" "$fx/hf_llama_tiny/config.json" >"$work/$1/config.json"
}
variant gemma 's/"LlamaForCausalLM"/"GemmaForCausalLM"/'
expect_error unknown_architecture 'architectures = ["GemmaForCausalLM"]: not supported' --from hf --input "$work/gemma" --output "$work/e1"
variant dynamic_rope 's/"rope_scaling": null/"rope_scaling": {"rope_type": "dynamic", "factor": 8.0}/'
expect_error rope_scaling 'rope_scaling.rope_type = "dynamic": not supported' --from hf --input "$work/dynamic_rope" --output "$work/e2"
variant yarn_short 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "original_max_position_embeddings": 16}/'
expect_error yarn_keys "missing key 'rope_scaling.factor'" --from hf --input "$work/yarn_short" --output "$work/e2c"
variant yarn_unknown 's/"rope_scaling": null/"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "short_factor": [1.0]}/'
expect_error yarn_unknown_key 'rope_scaling.short_factor = [1.0]: not supported: it changes the model (rope_type yarn)' --from hf --input "$work/yarn_unknown" --output "$work/e2d"
variant llama3_short 's/"rope_scaling": null/"rope_scaling": {"rope_type": "llama3", "factor": 8.0}/'
expect_error rope_scaling_keys "missing key 'rope_scaling.low_freq_factor'" --from hf --input "$work/llama3_short" --output "$work/e2b"
variant more_layers 's/"num_hidden_layers": 2/"num_hidden_layers": 3/'
expect_error missing_tensor "missing tensor 'model.layers.2." --from hf --input "$work/more_layers" --output "$work/e3"
variant fewer_layers 's/"num_hidden_layers": 2/"num_hidden_layers": 1/'
expect_error extra_tensor "unexpected tensor 'model.layers.1." --from hf --input "$work/fewer_layers" --output "$work/e4"
variant wide 's/"intermediate_size": 32/"intermediate_size": 48/'
expect_error shape "'model.layers.0.mlp.gate_proj.weight' has shape [32, 24]" --from hf --input "$work/wide" --output "$work/e5"
variant tied 's/"tie_word_embeddings": false/"tie_word_embeddings": true/'
expect_error tied_lm_head "'lm_head.weight' differs from 'model.embed_tokens.weight'" --from hf --input "$work/tied" --output "$work/e6"
mkdir -p "$work/no_weights" && cp "$fx/hf_llama_tiny/config.json" "$work/no_weights/"
expect_error no_weights "neither model.safetensors nor model.safetensors.index.json" --from hf --input "$work/no_weights" --output "$work/e7"
variant softcap 's/"use_cache": true/"use_cache": true, "attn_logit_softcapping": 30.0/'
expect_error unknown_key 'attn_logit_softcapping = 30.0: not supported: it changes the model' --from hf --input "$work/softcap" --output "$work/e8"
variant quantized 's/"use_cache": true/"use_cache": true, "quantization_config": {"quant_method": "fp8"}/'
expect_error quantized 'quantization_config = {"quant_method":"fp8"}: not supported: it changes the model' --from hf --input "$work/quantized" --output "$work/e9"
variant huge 's/"num_hidden_layers": 2/"num_hidden_layers": 1000000000/'
expect_error huge_layers 'num_hidden_layers = 1000000000: too large' --from hf --input "$work/huge" --output "$work/e10"
variant_t5() {  # variant_t5 NAME SED_EXPR: the transformers-5 llama folder with its config.json edited
  mkdir -p "$work/$1"
  cp "$fx/hf_llama_t5/model.safetensors" "$work/$1/"
  sed "$2" "$fx/hf_llama_t5/config.json" >"$work/$1/config.json"
}
variant_t5 two_thetas 's/"rope_parameters": {/"rope_theta": 10000.0, "rope_parameters": {/'
expect_error two_thetas 'rope_theta = 10000.0 and rope_parameters.rope_theta = 500000.0 disagree' --from hf --input "$work/two_thetas" --output "$work/e11"
variant_t5 t5_longrope 's/"rope_type": "default"/"rope_type": "longrope"/'
expect_error t5_longrope 'rope_parameters.rope_type = "longrope": not supported' --from hf --input "$work/t5_longrope" --output "$work/e12"
mkdir -p "$work/qwen3_moe_sparse" && cp "$fx/hf_qwen3_moe_tiny/model.safetensors" "$work/qwen3_moe_sparse/"
sed 's/"decoder_sparse_step": 1/"decoder_sparse_step": 2/' "$fx/hf_qwen3_moe_tiny/config.json" >"$work/qwen3_moe_sparse/config.json"
expect_error decoder_sparse_step 'decoder_sparse_step = 2: not supported' --from hf --input "$work/qwen3_moe_sparse" --output "$work/e15"
# Router options Mixtral and Qwen3-MoE cannot hold: the export refuses them in one line naming the
# key, before reading a weight (--config: the 1-rank run's config.yaml with one model key edited).
refuse_export() {  # refuse_export NAME FAMILY KEY VALUE: FAMILY's 1-rank run, model.KEY set to VALUE
  local run=$work/$2/tp1pp1
  sed "s|^  $3: .*|  $3: $4|" "$run/config.yaml" >"$work/$1.yaml"
  grep -qx "  $3: $4" "$work/$1.yaml" || { echo "$1: the edit did not apply"; exit 1; }
  expect_error "$1" "cannot hold this model: model.$3 = $4" --to hf --input "$run/ckpt" --output "$work/$1" \
    --config "$work/$1.yaml"
}
refuse_export mixtral_sigmoid mixtral_tiny moe_router_score_function sigmoid
refuse_export mixtral_unnormed mixtral_tiny moe_norm_topk_prob false
refuse_export mixtral_scaled mixtral_tiny moe_routed_scaling_factor 2.5
refuse_export mixtral_groups mixtral_tiny moe_n_group 2
refuse_export mixtral_bias mixtral_tiny moe_router_expert_bias true
refuse_export qwen3_moe_seq_aux qwen3_moe_tiny moe_seq_aux_loss_coeff 0.001
refuse_export qwen3_moe_dense qwen3_moe_tiny moe_first_k_dense_replace 1
refuse_export qwen3_moe_norm_sigmoid qwen3_moe_norm_tiny moe_router_score_function sigmoid
# DeepSeek-V3: what transformers' DeepseekV3 (or DeepSeek's own code) would read as another model.
variant_ds() {  # variant_ds NAME SED_EXPR: the DeepSeek-V3 folder with its config.json edited
  mkdir -p "$work/$1"
  cp "$fx/hf_deepseek_v3_tiny/model.safetensors" "$work/$1/"
  sed "$2" "$fx/hf_deepseek_v3_tiny/config.json" >"$work/$1/config.json"
}
variant_ds ds_topk_method 's/"topk_group": 2,/"topk_group": 2, "topk_method": "group_limited_greedy",/'
expect_error ds_topk_method 'topk_method = "group_limited_greedy": not supported: it changes the model (only "noaux_tc" is read)' --from hf --input "$work/ds_topk_method" --output "$work/e20"
variant_ds ds_softmax 's/"topk_group": 2,/"topk_group": 2, "scoring_func": "softmax",/'
expect_error ds_softmax 'scoring_func = "softmax": not supported' --from hf --input "$work/ds_softmax" --output "$work/e21"
variant_ds ds_kv_heads 's/"num_key_value_heads": 4/"num_key_value_heads": 2/'
expect_error ds_kv_heads 'num_key_value_heads = 2: not supported: must equal num_attention_heads (4' --from hf --input "$work/ds_kv_heads" --output "$work/e22"
variant_ds ds_bias 's/"attention_bias": false/"attention_bias": true/'
expect_error ds_bias 'attention_bias = true: not supported' --from hf --input "$work/ds_bias" --output "$work/e23"
variant_ds ds_head_dim 's/"qk_head_dim": 12/"qk_head_dim": 16/'
expect_error ds_head_dim 'qk_head_dim = 16: must equal qk_nope_head_dim + qk_rope_head_dim (12' --from hf --input "$work/ds_head_dim" --output "$work/e24"
variant_ds ds_layer_freq 's/"topk_group": 2,/"topk_group": 2, "moe_layer_freq": 2,/'
expect_error ds_layer_freq 'moe_layer_freq = 2: not supported: it changes the model (only 1 is read)' --from hf --input "$work/ds_layer_freq" --output "$work/e25"
refuse_export ds_softmax_export deepseek_v3_tiny moe_router_score_function softmax
refuse_export ds_no_bias_export deepseek_v3_tiny moe_router_expert_bias false
refuse_export ds_shared_export deepseek_v3_tiny moe_shared_expert_ffn_hidden_size 12
refuse_export ds_capacity_export deepseek_v3_tiny moe_capacity_factor 1.25
expect_error occupied "already holds model.safetensors" --to hf --input "$work/bf16/ckpt" --output "$work/bf16/f32"
echo "hf_llama: all checks passed"
