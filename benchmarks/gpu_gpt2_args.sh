# The pretrain_gpt arguments of a GPT-2 124M bf16 run on one GPU from an unpacked bundle, shared by
# benchmarks/gpu_gpt2_compare.sh and benchmarks/gpu_profile_step.sh (sourced):
#   gpt2_cuda_args BUNDLE_DIR STEPS MICRO OUTPUT_DIR   -> the array gpt2_args
# configs/gpt2_124m.yaml on synthetic tokens, one warm-up step of the learning rate, a log line per
# step, no evaluation or checkpoints. scripts/gpu_check.sh's gpt2_step runs the same (the bundle's
# check does not read the repository's benchmarks/).
gpt2_cuda_args() {
  gpt2_args=(--config "$1/share/configs/gpt2_124m.yaml" --set data.path=synthetic --set train.device=cuda
    --set train.precision=bf16 --set train.steps="$2" --set optimizer.warmup_steps=1
    --set train.micro_batch_size="$3" --set train.log_interval=1 --set train.eval_interval=0
    --set checkpoint.save_interval=0 --set 'checkpoint.dir=""' --set train.output_dir="$4")
}
