#!/usr/bin/env python3
"""Writes the LoRA fixtures of tests/scripts/lora.sh and tests/scripts/peft_check.py (committed; CI has
no Python).

Run with a Python that has torch and numpy: `/usr/bin/python3 tests/reference/make_lora_fixture.py`
(or PYTHONPATH=/tmp/torch2 python3 ...). transformers and peft are not needed: the model is written
out here in plain PyTorch, as in make_hf_llama.py, whose Llama fixture (hf_llama_tiny) is the base.

LoRA as PEFT's LoraLayer (peft/tuners/lora/layer.py) computes it: every target linear becomes
    y = x W^T (+ b) + (alpha / r) * B(A(dropout(x)))
with A [r, in] and B [out, r]; here r = 4, alpha = 8 (scale 2), dropout 0, on every linear of both
layers: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj. The base weights are frozen.

Initial adapters: B = 0, and A uniform in +-1/sqrt(in_features), which is what PEFT's
kaiming_uniform_(a = sqrt(5)) draws from; the values themselves are libparallel's layout-independent
draw (include/parallel/init.hpp: Philox-4x32-10 keyed by the seed 1234 and the FNV-1a hash of the
parameter's name, element i of the global tensor from counter i, u = (word0 >> 8) * 2^-24, value =
-bound + (2 bound) u in float32), reproduced here bit for bit, so the trainer starts from exactly
these adapters (lora.sh checks the step-0 export against them).

Training: 3 steps of torch.optim.AdamW on the adapters only (lr 1e-2, betas (0.9, 0.95), eps 1e-8,
weight_decay 0.1: every adapter is 2-D), constant lr, no clipping, on the batches of make_hf_llama.py
(tokens / targets from hf_llama_tiny_after3.safetensors), in float64. As make_hf_llama.py does, the
same run in float32 must stay within 1e-6 of the float64 losses and 2e-5 of the adapters (relative to
each tensor's largest value), or the fixture could not be matched by any float32 trainer.

Files (tests/reference/fixtures/):
  lora_llama_tiny_init.safetensors    the initial adapters under PEFT's names
                                      (base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight, ...)
  lora_llama_tiny_after3.safetensors  the adapters after the 3 updates under PEFT's names, losses [3]
                                      (each step's mean loss before its update), tokens / targets
                                      [3, 2, 8] I32, logits [2, 8, 48] of the adapted model on step 0's
                                      tokens after the updates (peft_check.py)
  lora_llama_tiny_merged.safetensors  every model tensor after the updates with the adapters merged in
                                      (W + alpha / r * B A), under Hugging Face's names (--merge-lora)
"""

import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402
from make_hf_llama import (BETAS, EPS, LR, MODELS, OUT_DIR, STEPS, VOCAB, WEIGHT_DECAY,  # noqa: E402
                           rms_norm, rope_tables, rotate_half)

torch.set_default_dtype(torch.float64)

RANK, ALPHA, SEED = 4, 8.0, 1234
SCALE = ALPHA / RANK
# Hugging Face module -> our parameter prefix (include/parallel/hf_model.hpp's table).
MODULES = [("self_attn.q_proj", "attention.query"), ("self_attn.k_proj", "attention.key"),
           ("self_attn.v_proj", "attention.value"), ("self_attn.o_proj", "attention.proj"),
           ("mlp.gate_proj", "mlp.gate"), ("mlp.up_proj", "mlp.up"), ("mlp.down_proj", "mlp.fc2")]
MASK32 = 0xFFFFFFFF


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": np.float32, "I32": np.int32}[info["dtype"]]
        a, b = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dtype).reshape(info["shape"]).copy())
    return out


def philox_word0(seed, stream, index):
    """Philox-4x32-10 as src/model/init.cpp: the first output word."""
    c0, c1, c2, c3 = index & MASK32, (index >> 32) & MASK32, stream & MASK32, (stream >> 32) & MASK32
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(10):
        p0, p1 = 0xD2511F53 * c0, 0xCD9E8D57 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & MASK32, (p0 >> 32) ^ c3 ^ k1, p0 & MASK32
        k0, k1 = (k0 + 0x9E3779B9) & MASK32, (k1 + 0xBB67AE85) & MASK32
    return c0


def name_hash(name):
    h = 0xCBF29CE484222325
    for c in name.encode():
        h = ((h ^ c) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def init_a(name, rank, fan_in):
    """init_uniform(param, 1234, -bound, bound) with bound = 1.0f / sqrtf(fan_in), in float32."""
    bound = np.float32(1.0) / np.sqrt(np.float32(fan_in))
    low, width = np.float32(-bound), np.float32(bound) - np.float32(-bound)
    stream = name_hash(name)
    values = np.empty(rank * fan_in, dtype=np.float32)
    for i in range(values.size):
        u = np.float32((philox_word0(SEED, stream, i) >> 8) * 2.0 ** -24)
        values[i] = low + width * u
    return torch.from_numpy(values.reshape(rank, fan_in))


def peft_name(layer, module, factor):
    return f"base_model.model.model.layers.{layer}.{module}.{factor}.weight"


def forward_logits(m, base, ad, tokens):
    b, s = tokens.shape
    h, hq, hkv = m["hidden"], m["heads"], m["kv"]
    d = h // hq
    cos, sin = (t.to(base["model.norm.weight"].dtype) for t in rope_tables(s, d, m["theta"]))
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    x = base["model.embed_tokens.weight"][tokens]
    for i in range(m["layers"]):
        pre = f"model.layers.{i}."

        def lin(module, inp):
            y = torch.nn.functional.linear(inp, base[pre + module + ".weight"])
            a, bb = ad[peft_name(i, module, "lora_A")], ad[peft_name(i, module, "lora_B")]
            return y + SCALE * torch.nn.functional.linear(torch.nn.functional.linear(inp, a), bb)

        a_in = rms_norm(x, base[pre + "input_layernorm.weight"], m["eps"])
        q = lin("self_attn.q_proj", a_in).view(b, s, hq, d).transpose(1, 2)
        k = lin("self_attn.k_proj", a_in).view(b, s, hkv, d).transpose(1, 2)
        v = lin("self_attn.v_proj", a_in).view(b, s, hkv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.repeat_interleave(k, hq // hkv, dim=1)
        v = torch.repeat_interleave(v, hq // hkv, dim=1)
        scores = ((q @ k.transpose(-1, -2)) / math.sqrt(d)).masked_fill(~causal, float("-inf"))
        o = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, hq * d)
        x = x + lin("self_attn.o_proj", o)
        mm = rms_norm(x, base[pre + "post_attention_layernorm.weight"], m["eps"])
        g = lin("mlp.gate_proj", mm)
        u = lin("mlp.up_proj", mm)
        x = x + lin("mlp.down_proj", torch.nn.functional.silu(g) * u)
    x = rms_norm(x, base["model.norm.weight"], m["eps"])
    return x @ base["lm_head.weight"].t()


def train(m, base, adapters, tokens, targets):
    opt = torch.optim.AdamW(list(adapters.values()), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        logits = forward_logits(m, base, adapters, tokens[step])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets[step].reshape(-1).long())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def main():
    m = MODELS["llama"]
    base32 = read_safetensors(os.path.join(OUT_DIR, "hf_llama_tiny", "model.safetensors"))
    records = read_safetensors(os.path.join(OUT_DIR, "hf_llama_tiny_after3.safetensors"))
    tokens, targets = records["tokens"].long(), records["targets"].long()

    initial = {}
    for i in range(m["layers"]):
        for module, ours in MODULES:
            w = base32[f"model.layers.{i}.{module}.weight"]
            out_f, in_f = w.shape
            initial[peft_name(i, module, "lora_A")] = init_a(f"layers.{i}.{ours}.lora_A.weight", RANK, in_f)
            initial[peft_name(i, module, "lora_B")] = torch.zeros(out_f, RANK, dtype=torch.float32)

    def run(dtype):
        base = {k: v.to(dtype) for k, v in base32.items()}
        ad = {k: v.to(dtype).clone().requires_grad_(True) for k, v in initial.items()}
        return base, ad, train(m, base, ad, tokens, targets)

    base, ad, losses = run(torch.float64)
    _, ad32, losses32 = run(torch.float32)
    for step, loss in enumerate(losses):
        print(f"lora step {step}: loss {loss:.9f}")
    loss_err = max(abs(a - b) / abs(a) for a, b in zip(losses, losses32))
    weight_err = max(((ad[k] - ad32[k].double()).abs().max() / ad[k].abs().max()).item() for k in ad)
    print(f"float32 PyTorch against float64: losses {loss_err:.2e}, adapters {weight_err:.2e}")
    assert loss_err < 1e-6 and weight_err < 2e-5, "ill-conditioned fixture (see make_hf_llama.py)"
    assert losses[2] < losses[0] - 1e-3 or abs(losses[2] - losses[0]) > 1e-3, "the adapters must change the loss"

    with torch.no_grad():
        logits = forward_logits(m, base, ad, tokens[0])
    write_safetensors(os.path.join(OUT_DIR, "lora_llama_tiny_init.safetensors"), initial)
    after = {k: v.detach() for k, v in ad.items()}
    after.update(tokens=tokens, targets=targets, losses=torch.tensor(losses), logits=logits)
    write_safetensors(os.path.join(OUT_DIR, "lora_llama_tiny_after3.safetensors"), after)
    merged = {k: v.double().clone() for k, v in base32.items()}
    for i in range(m["layers"]):
        for module, _ in MODULES:
            a, b = ad[peft_name(i, module, "lora_A")].detach(), ad[peft_name(i, module, "lora_B")].detach()
            merged[f"model.layers.{i}.{module}.weight"] += SCALE * (b @ a)
    write_safetensors(os.path.join(OUT_DIR, "lora_llama_tiny_merged.safetensors"), merged)
    print("wrote lora_llama_tiny_{init,after3,merged}.safetensors")


if __name__ == "__main__":
    main()
