#!/usr/bin/env python3
"""Writes the reference of a whole GPT with DeepSeek-V3's multi-token prediction (MTP) in float64
(tests/reference/fixtures/mtp_*.safetensors; committed, CI has no Python). Run with a Python that has
torch: `/usr/bin/python3 tests/reference/make_mtp_fixture.py` (or PYTHONPATH=/tmp/torch2).

The model is make_fixtures.py's GPT (docs/model.md's forward pass, rope positions) followed by D MTP
depths (docs/model.md, "Multi-token prediction"), depth k = 1..D with layer index i = L + k - 1:
  e_k   = Emb(t_{j+k})                       the shared word embedding, 0-token past the sequence
  h'_k  = [norm_i.enorm(e_k) ; norm_i.hnorm(h_{k-1})] @ eh_proj_i^T      (2h -> h)
  h_k   = transformer layer i (h'_k)          the make-up of the model's layers
  P_k   = final_norm_i(h_k) @ W_out^T        the shared output head
  L_k   = mean over positions j < S - k of CE(P_k[j], t_{j+k+1})
with h_0 the last layer's output before the final norm. The objective is
  loss + mtp_loss_scaling_factor / D * sum_k L_k.
Inputs rounded to float32 as make_fixtures.py does. Tensors: every parameter by its libparallel name,
grad.<name> of the objective, tokens / targets [b, S] int32 (targets = tokens shifted by one of one
S + 1 sequence), loss (the main loss), mtp_loss_<k> for each depth, objective. __metadata__: the
model config as make_fixtures.py writes it, plus mtp_num_layers and mtp_loss_scaling_factor.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import (OUT_DIR, attention, cross_entropy, gelu_tanh, layernorm, leaf, randn,  # noqa: E402
                           rmsnorm, rope, silu, write_safetensors)

torch.set_default_dtype(torch.float64)


def config(variant):
    common = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=48, vocab_size=100,
                  seq_length=8, max_position_embeddings=8, norm_epsilon=1e-5, rope_theta=10000.0,
                  micro_batch_size=2, position_embedding="rope")
    if variant == "untied_d2":  # Llama-like, untied output, two depths
        return dict(common, num_query_groups=2, normalization="rmsnorm", activation="swiglu", add_bias=False,
                    tie_embeddings=False, mtp_num_layers=2, mtp_loss_scaling_factor=0.3)
    # GPT-2-like norms and biases, tied output, one depth
    return dict(common, num_query_groups=4, normalization="layernorm", activation="gelu", add_bias=True,
                tie_embeddings=True, mtp_num_layers=1, mtp_loss_scaling_factor=0.5)


def parameters(cfg):
    h, f, V = cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["vocab_size"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_query_groups"]
    d = h // hq
    ln, bias = cfg["normalization"] == "layernorm", cfg["add_bias"]
    p = {"embedding.word.weight": randn(V, h, std=0.5)}

    def norm(prefix):
        p[prefix + ".weight"] = 1.0 + randn(h, std=0.2)
        if ln:
            p[prefix + ".bias"] = randn(h, std=0.1)

    def linear(prefix, out, inp, std, with_bias=True):
        p[prefix + ".weight"] = randn(out, inp, std=std)
        if bias and with_bias:
            p[prefix + ".bias"] = randn(out, std=0.1)

    def layer(i):
        pre = f"layers.{i}"
        norm(pre + ".input_norm")
        linear(pre + ".attention.query", hq * d, h, 0.3)
        linear(pre + ".attention.key", hkv * d, h, 0.3)
        linear(pre + ".attention.value", hkv * d, h, 0.3)
        linear(pre + ".attention.proj", h, hq * d, 0.2)
        norm(pre + ".post_attention_norm")
        if cfg["activation"] == "gelu":
            linear(pre + ".mlp.fc1", f, h, 0.3)
        else:
            linear(pre + ".mlp.gate", f, h, 0.3)
            linear(pre + ".mlp.up", f, h, 0.3)
        linear(pre + ".mlp.fc2", h, f, 0.2)

    for i in range(cfg["num_layers"]):
        layer(i)
    norm("final_norm")
    if not cfg["tie_embeddings"]:
        p["output.weight"] = randn(V, h, std=0.3)
    for k in range(1, cfg["mtp_num_layers"] + 1):
        i = cfg["num_layers"] + k - 1
        norm(f"layers.{i}.enorm")
        norm(f"layers.{i}.hnorm")
        linear(f"layers.{i}.eh_proj", h, 2 * h, 0.2, with_bias=False)  # no bias, as DeepSeek-V3's
        layer(i)
        norm(f"layers.{i}.final_norm")
    return p


def forward(cfg, p, seq):
    """seq [b, S + 1] -> (main loss, [L_1 .. L_D])."""
    h, L, D = cfg["hidden_size"], cfg["num_layers"], cfg["mtp_num_layers"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_query_groups"]
    d = h // hq
    eps = cfg["norm_epsilon"]
    b, S = seq.shape[0], seq.shape[1] - 1

    def norm(prefix, x):
        if cfg["normalization"] == "layernorm":
            return layernorm(x, p[prefix + ".weight"], p[prefix + ".bias"], eps)
        return rmsnorm(x, p[prefix + ".weight"], eps)

    def linear(prefix, x):
        y = x @ p[prefix + ".weight"].T
        if cfg["add_bias"] and prefix + ".bias" in p:
            y = y + p[prefix + ".bias"]
        return y

    def layer(i, x):
        pre = f"layers.{i}"
        a = norm(pre + ".input_norm", x)
        q = rope(linear(pre + ".attention.query", a).view(S, b, hq, d), cfg["rope_theta"])
        k = rope(linear(pre + ".attention.key", a).view(S, b, hkv, d), cfg["rope_theta"])
        v = linear(pre + ".attention.value", a).view(S, b, hkv, d)
        o, _ = attention(q, k, v, causal=True, scale=1.0 / math.sqrt(d))
        x = x + linear(pre + ".attention.proj", o.reshape(S, b, hq * d))
        m = norm(pre + ".post_attention_norm", x)
        if cfg["activation"] == "gelu":
            u = gelu_tanh(linear(pre + ".mlp.fc1", m))
        else:
            u = silu(linear(pre + ".mlp.gate", m)) * linear(pre + ".mlp.up", m)
        return x + linear(pre + ".mlp.fc2", u)

    emb = p["embedding.word.weight"]
    w_out = emb if cfg["tie_embeddings"] else p["output.weight"]
    padded = torch.cat([seq, torch.zeros(b, D + 1, dtype=seq.dtype)], dim=1)  # past the end: token 0

    x = emb[seq[:, :S].T.long()]  # [S, b, h]
    for i in range(L):
        x = layer(i, x)
    logits = norm("final_norm", x) @ w_out.T
    loss = cross_entropy(logits.reshape(S * b, -1), seq[:, 1:].T.reshape(-1)).mean()

    mtp = []
    hk = x
    for k in range(1, D + 1):
        i = L + k - 1
        e = emb[padded[:, k:k + S].T.long()]  # t_{j+k}
        cat = torch.cat([norm(f"layers.{i}.enorm", e), norm(f"layers.{i}.hnorm", hk)], dim=-1)
        hk = layer(i, linear(f"layers.{i}.eh_proj", cat))
        lk = norm(f"layers.{i}.final_norm", hk) @ w_out.T  # [S, b, V]
        valid = S - k  # positions j whose target t_{j+k+1} is inside the sequence
        target = seq[:, k + 1:k + 1 + valid].T  # [valid, b]
        mtp.append(cross_entropy(lk[:valid].reshape(valid * b, -1), target.reshape(-1)).mean())
    return loss, mtp


def fixture(variant, seed):
    torch.manual_seed(seed)
    cfg = config(variant)
    params = {k: leaf(v) for k, v in parameters(cfg).items()}
    b, S, V = cfg["micro_batch_size"], cfg["seq_length"], cfg["vocab_size"]
    seq = torch.randint(0, V, (b, S + 1), dtype=torch.int32)
    loss, mtp = forward(cfg, params, seq)
    objective = loss + cfg["mtp_loss_scaling_factor"] / cfg["mtp_num_layers"] * sum(mtp)
    names = sorted(params)
    g = torch.autograd.grad(objective, [params[n] for n in names])
    out = {n: params[n] for n in names}
    out.update({"grad." + n: gn for n, gn in zip(names, g)})
    out.update(tokens=seq[:, :S].contiguous(), targets=seq[:, 1:].contiguous(), loss=loss, objective=objective)
    for k, lk in enumerate(mtp, start=1):
        out[f"mtp_loss_{k}"] = lk
    meta = {k: (str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v))
            for k, v in cfg.items()}
    return out, meta


def main():
    for variant, seed in (("untied_d2", 301), ("tied_d1", 302)):
        tensors, meta = fixture(variant, seed)
        write_safetensors(os.path.join(OUT_DIR, f"mtp_{variant}.safetensors"), tensors, meta)


if __name__ == "__main__":
    main()
