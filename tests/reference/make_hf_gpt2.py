#!/usr/bin/env python3
"""Writes the Hugging Face GPT-2 fixtures of tests/mpi/test_hf_gpt2.cpp (committed; CI has no Python).

Run with a Python that has torch: `/usr/bin/python3 tests/reference/make_hf_gpt2.py`.

A tiny GPT-2 in plain PyTorch that follows transformers' GPT2LMHeadModel structure and tensor names
exactly: Conv1D weights stored [in, out] (y = x W + b), c_attn's output columns [query | key | value],
the tanh GeLU ("gelu_new"), LayerNorm eps 1e-5, scaled dot-product causal attention (1/sqrt(d)),
lm_head tied to wte. 2 layers, n_embd 32, n_head 4, n_inner 128, n_positions 16, vocab 100 (not a
multiple of 128, so our vocabulary padding is exercised). No dropout.

Initial weights are GPT-2's init (normal(0, 0.02); c_proj weights normal(0, 0.02 / sqrt(2 L))) except
that biases and LayerNorm parameters are random too (bias normal(0, 0.02), norm weight 1 + normal(0, 0.1)),
so a mapping mistake cannot hide behind zeros and ones. Every value is rounded to float32; training runs
in float64 (like tests/reference/make_fixtures.py), so the only error of the fixture is the final rounding.

Training: 3 steps of torch.optim.AdamW (lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on the
>= 2-dim parameters only, via two parameter groups; constant lr, no clipping) on the mean token
cross-entropy of a fixed batch per step (batch 2, seq 8, targets given explicitly: no internal shift).

Files (tests/reference/fixtures/):
  hf_gpt2_tiny.safetensors         the initial model as HF writes it: "transformer."-prefixed names,
                                   "lm_head.weight" (= wte) and the legacy attention buffers
                                   transformer.h.{i}.attn.bias [1, 1, 16, 16] (causal mask) and
                                   transformer.h.{i}.attn.masked_bias [] (-1e4), which importers ignore
  hf_gpt2_tiny_after3.safetensors  tokens [3, 2, 8] I32, targets [3, 2, 8] I32 (step, batch, seq),
                                   losses [3] (the mean loss of each step, before its update), and
                                   every model tensor after the 3 updates under its HF name (with the
                                   prefix; no lm_head, no buffers)
  hf_gpt2_tiny.yaml                the matching training config for our side (model section)
  hf_gpt2_tiny_config.json         the config.json of an HF folder holding hf_gpt2_tiny.safetensors as
                                   model.safetensors (convert_checkpoint --from hf; tests/scripts/hf_llama.sh)
"""

import json
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402  (the same minimal writer)

torch.set_default_dtype(torch.float64)
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

N_LAYER, N_EMBD, N_HEAD, N_INNER, N_POSITIONS, VOCAB = 2, 32, 4, 128, 16, 100
BATCH, SEQ, STEPS = 2, 8, 3
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1
LN_EPS = 1e-5


def f32(t):
    """Rounded to float32, held in float64."""
    return t.to(torch.float32).to(torch.float64)


def init_params():
    torch.manual_seed(20240611)
    p = {}
    std, proj_std = 0.02, 0.02 / math.sqrt(2 * N_LAYER)

    def normal(*shape, s=std):
        return f32(torch.randn(*shape) * s)

    def norm_weight(n):
        return f32(1.0 + 0.1 * torch.randn(n))

    p["wte.weight"] = normal(VOCAB, N_EMBD)
    p["wpe.weight"] = normal(N_POSITIONS, N_EMBD)
    for i in range(N_LAYER):
        h = f"h.{i}."
        p[h + "ln_1.weight"] = norm_weight(N_EMBD)
        p[h + "ln_1.bias"] = normal(N_EMBD)
        p[h + "attn.c_attn.weight"] = normal(N_EMBD, 3 * N_EMBD)
        p[h + "attn.c_attn.bias"] = normal(3 * N_EMBD)
        p[h + "attn.c_proj.weight"] = normal(N_EMBD, N_EMBD, s=proj_std)
        p[h + "attn.c_proj.bias"] = normal(N_EMBD)
        p[h + "ln_2.weight"] = norm_weight(N_EMBD)
        p[h + "ln_2.bias"] = normal(N_EMBD)
        p[h + "mlp.c_fc.weight"] = normal(N_EMBD, N_INNER)
        p[h + "mlp.c_fc.bias"] = normal(N_INNER)
        p[h + "mlp.c_proj.weight"] = normal(N_INNER, N_EMBD, s=proj_std)
        p[h + "mlp.c_proj.bias"] = normal(N_EMBD)
    p["ln_f.weight"] = norm_weight(N_EMBD)
    p["ln_f.bias"] = normal(N_EMBD)
    return {k: v.clone().requires_grad_(True) for k, v in p.items()}


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def conv1d(x, w, b):
    """transformers.pytorch_utils.Conv1D: weight [in, out]."""
    return x @ w + b


def forward(p, tokens, targets):
    """Mean token cross-entropy of GPT2LMHeadModel (tied lm_head) on explicit targets."""
    b, s = tokens.shape
    d = N_EMBD // N_HEAD
    x = p["wte.weight"][tokens] + p["wpe.weight"][torch.arange(s)]  # [b, s, h]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    for i in range(N_LAYER):
        h = f"h.{i}."
        a = torch.nn.functional.layer_norm(x, (N_EMBD,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], LN_EPS)
        q, k, v = conv1d(a, p[h + "attn.c_attn.weight"], p[h + "attn.c_attn.bias"]).split(N_EMBD, dim=2)
        q, k, v = (t.view(b, s, N_HEAD, d).transpose(1, 2) for t in (q, k, v))  # [b, heads, s, d]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~causal, float("-inf"))
        o = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, N_EMBD)
        x = x + conv1d(o, p[h + "attn.c_proj.weight"], p[h + "attn.c_proj.bias"])
        m = torch.nn.functional.layer_norm(x, (N_EMBD,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], LN_EPS)
        u = gelu_new(conv1d(m, p[h + "mlp.c_fc.weight"], p[h + "mlp.c_fc.bias"]))
        x = x + conv1d(u, p[h + "mlp.c_proj.weight"], p[h + "mlp.c_proj.bias"])
    x = torch.nn.functional.layer_norm(x, (N_EMBD,), p["ln_f.weight"], p["ln_f.bias"], LN_EPS)
    logits = x @ p["wte.weight"].t()  # lm_head tied to wte
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1).long())


def hf_names(p):
    return {"transformer." + k: v.detach() for k, v in p.items()}


def main():
    p = init_params()
    initial = hf_names(p)
    initial["lm_head.weight"] = p["wte.weight"].detach()
    causal = torch.ones(N_POSITIONS, N_POSITIONS).tril().view(1, 1, N_POSITIONS, N_POSITIONS)
    for i in range(N_LAYER):
        initial[f"transformer.h.{i}.attn.bias"] = causal
        initial[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    write_safetensors(os.path.join(OUT_DIR, "hf_gpt2_tiny.safetensors"), initial, {"format": "pt"})

    # Each step's batch: windows of one random sequence, the targets being the next tokens.
    gen = torch.Generator().manual_seed(7)
    seqs = torch.randint(0, VOCAB, (STEPS, BATCH, SEQ + 1), generator=gen)
    tokens, targets = seqs[:, :, :-1].contiguous(), seqs[:, :, 1:].contiguous()

    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = forward(p, tokens[step], targets[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
        print(f"step {step}: loss {loss.item():.6f}")

    after = hf_names(p)
    after["tokens"] = tokens
    after["targets"] = targets
    after["losses"] = torch.tensor(losses)
    write_safetensors(os.path.join(OUT_DIR, "hf_gpt2_tiny_after3.safetensors"), after)

    with open(os.path.join(OUT_DIR, "hf_gpt2_tiny.yaml"), "w") as f:
        f.write(f"""# The model of hf_gpt2_tiny.safetensors (written by tests/reference/make_hf_gpt2.py).
model:
  num_layers: {N_LAYER}
  hidden_size: {N_EMBD}
  num_attention_heads: {N_HEAD}
  ffn_hidden_size: {N_INNER}
  vocab_size: {VOCAB}
  seq_length: {SEQ}
  max_position_embeddings: {N_POSITIONS}
  normalization: layernorm
  activation: gelu
  position_embedding: learned
  add_bias: true
  tie_embeddings: true
  norm_epsilon: {LN_EPS}
  dropout: 0.0
""")

    write_config_json()


def write_config_json():
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "n_layer": N_LAYER,
        "n_embd": N_EMBD,
        "n_head": N_HEAD,
        "n_inner": N_INNER,
        "n_positions": N_POSITIONS,
        "n_ctx": N_POSITIONS,
        "vocab_size": VOCAB,
        "layer_norm_epsilon": LN_EPS,
        "activation_function": "gelu_new",
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    with open(os.path.join(OUT_DIR, "hf_gpt2_tiny_config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


if __name__ == "__main__":
    main()
