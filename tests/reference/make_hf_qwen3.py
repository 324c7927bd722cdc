#!/usr/bin/env python3
"""Writes the Qwen3 fixtures of tests/scripts/hf_llama.sh (committed; CI has no Python).

Tiny models built, saved and trained by transformers itself (its own Qwen3ForCausalLM, eager
attention), so that the reference is transformers' code and not a rewrite of it:

  hf_qwen3_tiny/   Qwen3ForCausalLM: hidden 24, 4 heads of head_dim 8 (not 24 / 4 = 6: q_proj is
                   [32, 24], o_proj [24, 32]), 2 kv heads, qk-norm (q_norm / k_norm [8]), no biases,
                   ffn 32, 2 layers, vocab 48, rope_theta 10000, tied embeddings, rms_norm_eps 1e-6
  hf_qwen3_tiny_after3.safetensors   every tensor after 3 AdamW steps under its HF name, losses [3]
                   (each step's mean loss before its update), tokens / targets [3, 2, 8]
  hf_qwen3_moe_norm_tiny/   Qwen3MoeForCausalLM with norm_topk_prob true (the top-k router weights
                   renormalised to sum 1), otherwise as hf_qwen3_moe_tiny; its _after3 as above

config.json is what transformers 5 writes (rope_parameters, dtype, layer_types). Weights are drawn
as make_hf_llama.py draws them (normal(0, 1/sqrt(fan_in)), the tied embedding normal(0, 1/sqrt(h)),
norm weights 1 + normal(0, 0.1), q_norm / k_norm included), rounded to float32. Training is
make_hf_llama.py's: seq 8, batch 2, 3 steps of torch.optim.AdamW (lr 1e-2, betas 0.9/0.95, eps
1e-8, weight decay 0.1 on matrices only) on the mean cross-entropy of the logits against the next
tokens of hf_tokens_text_document, in float64. The script checks that float32 training stays within
1e-6 (losses) and 2e-5 (weights, relative to each tensor's largest) of it (the fixture is well
conditioned: see make_hf_llama.py), and that the qk-norm weights matter (a loss moves by > 1e-4
when they are reset to 1). transformers' RMSNorm computes in float32 even for float64 inputs; that
rounding (~1e-7) is part of the reference.

Run with transformers 5 and PyTorch 2 in side folders (nothing installed system-wide):
  bash ../shared/tools/torch2_setup.sh                        # torch in /tmp/torch2
  python3 -m pip install --target /tmp/hf5 transformers       # transformers 5.x in /tmp/hf5
  PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/make_hf_qwen3.py
"""

import json
import math
import os
import shutil
import sys

import torch
import transformers
from transformers import (AutoModelForCausalLM, MixtralConfig, MixtralForCausalLM, Qwen3Config, Qwen3ForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402
from make_hf_transformers5 import BATCH, BETAS, EPS, LR, SEQ, STEPS, VOCAB, WEIGHT_DECAY, batches  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

MODELS = {
    "qwen3_tiny": (Qwen3Config, Qwen3ForCausalLM, 707,
                   dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=32, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
                        hidden_act="silu", initializer_range=0.02, rms_norm_eps=1e-6, tie_word_embeddings=True,
                        attention_bias=False, attention_dropout=0.0, use_sliding_window=False,
                        max_window_layers=2, bos_token_id=1, eos_token_id=2,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen3_moe_tiny": (Qwen3MoeConfig, Qwen3MoeForCausalLM, 808,
                       dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=32, moe_intermediate_size=16,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1,
                            mlp_only_layers=[], output_router_logits=False, router_aux_loss_coef=0.001,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                            max_position_embeddings=64, hidden_act="silu", initializer_range=0.02,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                            attention_dropout=0.0, use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                            rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    # Qwen3-MoE renormalising the top-k router weights (model.moe_norm_topk_prob).
    "qwen3_moe_norm_tiny": (Qwen3MoeConfig, Qwen3MoeForCausalLM, 811,
                            dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=32, moe_intermediate_size=16,
                                 num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                                 mlp_only_layers=[], output_router_logits=False, router_aux_loss_coef=0.001,
                                 num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                 max_position_embeddings=64, hidden_act="silu", initializer_range=0.02,
                                 rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
                                 attention_dropout=0.0, use_sliding_window=False, bos_token_id=1, eos_token_id=2,
                                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "mixtral_tiny": (MixtralConfig, MixtralForCausalLM, 909,
                     dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=16, num_local_experts=4,
                          num_experts_per_tok=2, output_router_logits=False, router_aux_loss_coef=0.02,
                          router_jitter_noise=0.0, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=2, head_dim=6, max_position_embeddings=64, hidden_act="silu",
                          initializer_range=0.02, rms_norm_eps=1e-5, tie_word_embeddings=False,
                          attention_dropout=0.0, sliding_window=None, bos_token_id=1, eos_token_id=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
}


def init_weights(model, config, seed):
    """make_hf_llama.py's draw, by tensor name and shape, rounded to float32."""
    torch.manual_seed(seed)
    h = config.hidden_size
    state = {}
    for name, p in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(p.shape)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(p.shape) / (math.sqrt(h) if config.tie_word_embeddings else 1.0)
        else:  # linears [out, in]; experts fused as transformers 5 holds them, [E, out, in]
            assert p.dim() in (2, 3), name
            t = torch.randn(p.shape) / math.sqrt(p.shape[-1])
        state[name] = t.to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing), (missing, unexpected)


def hf_names(model, config):
    """The parameters under the names save_pretrained writes: transformers 5 holds a MoE layer's
    experts fused (experts.gate_up_proj [E, 2f, h], experts.down_proj [E, h, f]) and saves one
    tensor per expert (Qwen3-MoE: experts.E.{gate,up,down}_proj; Mixtral: block_sparse_moe.experts.E.
    {w1, w3, w2}, its router block_sparse_moe.gate)."""
    mixtral = isinstance(config, MixtralConfig)
    out = {}
    for name, p in model.named_parameters():
        p = p.detach()
        if ".mlp.experts." not in name:
            if mixtral and ".mlp.gate.weight" in name:
                name = name.replace(".mlp.gate.", ".block_sparse_moe.gate.")
            out[name] = p
            continue
        block = name[:name.index(".experts.")].replace(".mlp", ".block_sparse_moe" if mixtral else ".mlp")
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for e in range(p.shape[0]):
            if name.endswith("gate_up_proj"):
                gate, up = p[e].chunk(2, dim=0)
                out[f"{block}.experts.{e}.{names[0]}.weight"] = gate
                out[f"{block}.experts.{e}.{names[1]}.weight"] = up
            else:
                out[f"{block}.experts.{e}.{names[2]}.weight"] = p[e]
    return out


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def train(model, tokens, targets):
    params = dict(model.named_parameters())
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, tokens[step], targets[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def load(folder, dtype):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager")
    model.train()  # dropout is 0
    return model


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    assert transformers.__version__.split(".")[0] == "5", "these fixtures are transformers 5's layout"
    tokens, targets = batches()
    only = set(sys.argv[1:])
    for name, (config_class, model_class, seed, kwargs) in MODELS.items():
        if only and name not in only:
            continue
        folder = os.path.join(OUT_DIR, f"hf_{name}")
        shutil.rmtree(folder, ignore_errors=True)
        config = config_class(**kwargs)
        config.architectures = [model_class.__name__]
        model = model_class(config).to(torch.float32)
        init_weights(model, config, seed)
        model.save_pretrained(folder)
        for extra in os.listdir(folder):
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(folder, extra))
        with open(os.path.join(folder, "config.json")) as f:
            written = json.load(f)
        assert "rope_parameters" in written and "dtype" in written, written
        from safetensors import safe_open
        with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
            saved = set(f.keys())
        assert saved == set(hf_names(model, config)), sorted(saved ^ set(hf_names(model, config)))
        print(f"wrote {os.path.relpath(folder)}")

        model = load(folder, torch.float64)
        with torch.no_grad():
            first = loss_of(model, tokens[0], targets[0]).item()
            plain = load(folder, torch.float64)
            for n, p in plain.named_parameters():
                if n.endswith(("q_norm.weight", "k_norm.weight")):
                    p.fill_(1.0)
            unnormed = loss_of(plain, tokens[0], targets[0]).item()
        print(f"{name}: first loss {first:.8f}; q_norm / k_norm weights reset to 1: {unnormed:.8f}")
        if any(n.endswith("q_norm.weight") for n, _ in plain.named_parameters()):
            assert abs(unnormed - first) > 1e-4 * first, "the qk-norm weights must matter for this fixture"
        losses = train(model, tokens, targets)
        model32 = load(folder, torch.float32)
        losses32 = train(model32, tokens, targets)
        # Under the names save_pretrained writes (5.x splits the fused experts per expert on save).
        after = hf_names(model, config)
        after32 = hf_names(model32, config)
        for step in range(STEPS):
            rel = abs(losses32[step] - losses[step]) / losses[step]
            print(f"{name} step {step}: float64 {losses[step]:.8f}, float32 {losses32[step]:.8f} (relative {rel:.1e})")
            assert rel < 1e-6, "float32 training must stay close to float64 (conditioning)"
        worst = max(((after32[k].double() - after[k]).abs().max() / after[k].abs().max()).item() for k in after)
        print(f"{name}: float32 weights after 3 steps: worst {worst:.1e} of the tensor's max")
        assert worst < 2e-5, "float32 training must stay close to float64 (conditioning)"
        after["tokens"] = tokens
        after["targets"] = targets
        after["losses"] = torch.tensor(losses)
        write_safetensors(os.path.join(OUT_DIR, f"hf_{name}_after3.safetensors"), after)


if __name__ == "__main__":
    main()
