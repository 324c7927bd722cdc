#!/usr/bin/env bash
# A LoRA fine-tune's adapter in Hugging Face's PEFT (peft_check.py): the hf_llama_tiny fixture
# imported, trained 3 steps with the adapters of tests/reference/make_lora_fixture.py on one rank,
# exported with convert_checkpoint --to peft, loaded by peft into transformers' model of the same
# folder. PEFT is not a dependency: skipped (77) when python3 cannot import torch, transformers and
# peft (python3 -m pip install --target /tmp/peft peft accelerate; then
# PYTHONPATH=/tmp/peft:/tmp/hf5:/tmp/torch2 ctest -R peft_check).
#   peft_check.sh SOURCE_DIR CONVERT_CHECKPOINT PRETRAIN_GPT MPIEXEC...
set -euo pipefail
src=$1 convert=$2 pretrain=$3
shift 3
mpiexec=("$@")
if ! python3 -c 'import torch, transformers, peft' 2>/dev/null; then
  echo "SKIPPED: python3 cannot import torch, transformers and peft (python3 -m pip install --target" \
    "/tmp/peft peft accelerate; then PYTHONPATH=/tmp/peft:/tmp/hf5:/tmp/torch2 ctest -R peft_check)"
  exit 77
fi
fx=$src/tests/reference/fixtures
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export PARALLEL_LOG_LEVEL=warn
"$convert" --from hf --input "$fx/hf_llama_tiny" --output "$work/base" >/dev/null
"${mpiexec[@]}" -np 1 "$pretrain" --config "$work/base.yaml" --set checkpoint.load="$work/base" \
  --set checkpoint.dir="$work/ckpt" --set train.output_dir="$work/run" \
  --set model.seq_length=8 --set train.global_batch_size=2 --set train.micro_batch_size=1 \
  --set train.steps=3 --set train.log_interval=1 --set train.eval_interval=0 --set train.seed=1234 \
  --set data.path="$fx/hf_tokens_text_document" --set data.split=1,0,0 --set data.shuffle=false \
  --set optimizer.lr=0.01 --set optimizer.lr_decay=constant --set optimizer.warmup_steps=0 \
  --set optimizer.weight_decay=0.1 --set optimizer.beta1=0.9 --set optimizer.beta2=0.95 \
  --set optimizer.eps=1e-8 --set optimizer.clip_grad=0 --set model.dropout=0 \
  --set model.lora.rank=4 --set model.lora.alpha=8 \
  --set model.lora.target_modules=q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj >"$work/train.log" 2>&1 ||
  { tail -20 "$work/train.log"; exit 1; }
"$convert" --to peft --input "$work/ckpt" --output "$work/peft" --base-model "$fx/hf_llama_tiny" >/dev/null
python3 "$src/tests/scripts/peft_check.py" "$work/peft" "$fx/hf_llama_tiny" "$fx/lora_llama_tiny_after3.safetensors"
