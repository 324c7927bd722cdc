#!/usr/bin/env python3
"""Writes the YaRN fixture of tests/scripts/hf_llama.sh (committed; CI has no Python): a tiny
Qwen2ForCausalLM whose rotary embedding is YaRN-scaled, saved and trained by transformers 5 itself.

  hf_qwen2_yarn_t5/   config.json as transformers 5 writes it, rope_parameters {"rope_type": "yarn",
                      rope_theta 10, factor 4, original_max_position_embeddings 16,
                      beta_fast 32, beta_slow 1} (max_position_embeddings 64), and model.safetensors:
                      make_hf_llama.py's hf_qwen2_tiny weights (GQA, tied embeddings, q/k/v biases)
  hf_qwen2_yarn_t5_after3.safetensors
                      the weights after 3 AdamW steps, the losses [3], tokens and targets [3, 2, 8],
                      all computed by transformers' Qwen2ForCausalLM in float64
The export's logits against this folder's are checked by tests/reference/check_hf_export.py.

With head size 6 (3 rotary pairs), rope_theta 10 and L = 16, YaRN's ramp keeps pair 0's frequency,
blends pair 1 half-way and divides pair 2 by the factor; its attention factor 0.1 ln 4 + 1 = 1.139
multiplies cos and sin, so the scores by 1.297. The script checks that reading the folder without the
scaling (or with the frequencies but without the attention factor) gives a different loss. theta 10
keeps every pair turning over the 8-token window: with theta 1000 the slowest pair turned 0.02 rad,
the key bias's component along it had an almost-zero gradient, and Adam's normalised step of that
rounding noise left one element 1.4e-5 off under tp2 x pp2 (docs/huggingface.md, "Tested", has the
same story for a Qwen2 with theta 1e6). The script also trains the folder in float32 and checks it
stays within 1e-6 (losses) and 2e-5 (weights) of float64, as make_hf_transformers5.py does. Training is
make_hf_transformers5.py's: seq 8, batch 2, 3 steps of torch.optim.AdamW (lr 1e-2, betas 0.9/0.95,
eps 1e-8, weight decay 0.1 on matrices only), the mean cross-entropy against the next tokens of
hf_tokens_text_document.

  PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/make_hf_yarn.py
"""

import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import Qwen2Config, Qwen2ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402
from make_hf_transformers5 import OUT_DIR, STEPS, VOCAB, batches, loss_of, train  # noqa: E402

YARN = {"rope_type": "yarn", "rope_theta": 10.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0}
KWARGS = dict(vocab_size=VOCAB, num_hidden_layers=2, num_key_value_heads=2, max_position_embeddings=64,
              hidden_act="silu", initializer_range=0.02, attention_dropout=0.0, bos_token_id=1, eos_token_id=2,
              hidden_size=24, intermediate_size=32, num_attention_heads=4, rms_norm_eps=1e-6,
              tie_word_embeddings=True, use_sliding_window=False, max_window_layers=2)


def model_with(rope_parameters, state, dtype):
    model = Qwen2ForCausalLM(Qwen2Config(**dict(KWARGS, rope_parameters=rope_parameters)))
    model.load_state_dict(state)
    return model.to(dtype)


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    assert transformers.__version__.split(".")[0] == "5", "this fixture is transformers 5's layout"
    tokens, targets = batches()
    folder = os.path.join(OUT_DIR, "hf_qwen2_yarn_t5")
    shutil.rmtree(folder, ignore_errors=True)
    config = Qwen2Config(**dict(KWARGS, rope_parameters=dict(YARN)))
    config.architectures = ["Qwen2ForCausalLM"]
    weights = load_file(os.path.join(OUT_DIR, "hf_qwen2_tiny", "model.safetensors"))
    model = Qwen2ForCausalLM(config).to(torch.float32)
    missing, unexpected = model.load_state_dict(weights, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.save_pretrained(folder)
    for extra in os.listdir(folder):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(folder, extra))
    with open(os.path.join(folder, "config.json")) as f:
        written = json.load(f)
    assert written["rope_parameters"]["rope_type"] == "yarn" and "rope_theta" not in written, written
    print(f"wrote {os.path.relpath(folder)}: rope_parameters = {json.dumps(written['rope_parameters'])}")

    model = Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
    model.train()  # dropout is 0: train() only makes the check honest
    rotary = model.model.rotary_emb
    print(f"inv_freq {rotary.inv_freq.tolist()}, attention_scaling {rotary.attention_scaling}")
    state = model.state_dict()
    with torch.no_grad():
        first = loss_of(model, tokens[0], targets[0]).item()
        plain = loss_of(model_with({"rope_type": "default", "rope_theta": YARN["rope_theta"]}, state, torch.float64),
                        tokens[0], targets[0]).item()
        no_factor = loss_of(model_with(dict(YARN, attention_factor=1.0), state, torch.float64), tokens[0],
                            targets[0]).item()
    model32 = Qwen2ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager")
    model32.train()
    print(f"first loss {first:.8f}; without scaling {plain:.8f} (relative {abs(plain - first) / first:.1e}); "
          f"without the attention factor {no_factor:.8f} (relative {abs(no_factor - first) / first:.1e})")
    assert abs(plain - first) > 1e-4 * first and abs(no_factor - first) > 1e-4 * first, "yarn must matter"
    losses = train(model, tokens, targets)
    losses32 = train(model32, tokens, targets)
    for step in range(STEPS):
        print(f"step {step}: transformers float64 loss {losses[step]:.8f}, float32 {losses32[step]:.8f}")
        assert abs(losses32[step] - losses[step]) < 1e-6 * losses[step], "float32 drifts from float64"
    after = {k: v.detach() for k, v in model.named_parameters()}
    after32 = dict(model32.named_parameters())
    worst = max(((after32[k].double() - after[k]).abs().max() / after[k].abs().max()).item() for k in after)
    print(f"float32 weights after 3 steps against float64: worst {worst:.1e} of the tensor's max")
    assert worst < 2e-5, "the fixture is ill-conditioned for float32 training"
    after["tokens"] = tokens
    after["targets"] = targets
    after["losses"] = torch.tensor(losses)
    write_safetensors(os.path.join(OUT_DIR, "hf_qwen2_yarn_t5_after3.safetensors"), after)


if __name__ == "__main__":
    main()
