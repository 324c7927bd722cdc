#!/usr/bin/env python3
"""Writes the reference of one multi-head latent attention layer (DeepSeek-V2/V3's MLA) from
transformers' own DeepseekV3Attention in float64 (tests/reference/fixtures/mla_*.safetensors;
committed, CI has no Python). Run with
`PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/make_mla_fixture.py` (transformers 5.x).

Inputs rounded to float32 as make_fixtures.py does. The layer (docs/model.md, "Multi-head latent
attention"; src/model/latent_attention.cpp) runs causally over positions 0..s-1 with the eager
attention; objective = sum(y * dy), so the fixture holds y, dx and every weight gradient.

Tensors, in libparallel's names and layouts (x, dy, y, dx [s, b, h]):
  q_down [q_lora_rank, h], q_latent_norm [q_lora_rank], q_up [H (n + r), q_lora_rank] (or query [H (n + r), h]
  when q_lora_rank is 0), kv_down [kv_lora_rank + r, h], kv_norm [kv_lora_rank],
  kv_up [H (n + dv), kv_lora_rank], proj [h, H dv]; grad.<name> for each.
rope_interleave (DeepSeek-V3's layout: rope dimensions in interleaved pairs) is a permutation of the
rope rows of q_up / query and kv_down: the fixture of an interleaved model stores the weights and
gradients permuted to the rotate-half order libparallel uses (what the Hugging Face import does), so
the same C++ layer must reproduce the interleaved model's y and dx exactly.
__metadata__: hidden, heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
v_head_dim, rope_theta, norm_epsilon, rope_interleave, and the yarn keys when rope scaling is yarn.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT_DIR, randn, write_safetensors  # noqa: E402

from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config  # noqa: E402
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (  # noqa: E402
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)

torch.set_default_dtype(torch.float64)

H, HIDDEN, NOPE, ROPE, V, KV_RANK = 4, 24, 6, 4, 5, 10
S, B = 8, 2


def deinterleave_rows(w, heads, head_dim, start, rope):
    """Rows [start, start + rope) of each head's block: (x0, x1, x2, ...) -> (x0, x2, ..., x1, x3, ...)."""
    w = w.clone().reshape(heads, head_dim, *w.shape[1:])
    part = w[:, start:start + rope]
    w[:, start:start + rope] = torch.cat([part[:, 0::2], part[:, 1::2]], dim=1)
    return w.reshape(heads * head_dim, *w.shape[2:])


def make(name, seed, q_lora_rank, rope_parameters, interleave):
    torch.manual_seed(seed)
    config = DeepseekV3Config(
        hidden_size=HIDDEN, num_attention_heads=H, num_key_value_heads=H, q_lora_rank=q_lora_rank,
        kv_lora_rank=KV_RANK, qk_nope_head_dim=NOPE, qk_rope_head_dim=ROPE, v_head_dim=V,
        rope_interleave=interleave, rms_norm_eps=1e-6, attention_bias=False, max_position_embeddings=16,
        rope_parameters=rope_parameters, attn_implementation="eager")
    attn = DeepseekV3Attention(config, layer_idx=0).double()
    rotary = DeepseekV3RotaryEmbedding(config).double()
    names = {"kv_a_proj_with_mqa": "kv_down", "kv_a_layernorm": "kv_norm", "kv_b_proj": "kv_up",
             "o_proj": "proj"}
    if q_lora_rank:
        names.update({"q_a_proj": "q_down", "q_a_layernorm": "q_latent_norm", "q_b_proj": "q_up"})
    else:
        names["q_proj"] = "query"
    with torch.no_grad():
        for hf, _ in names.items():
            m = getattr(attn, hf)
            if hf.endswith("layernorm"):
                m.weight.copy_(1.0 + randn(*m.weight.shape, std=0.2))
            else:
                m.weight.copy_(randn(*m.weight.shape, std=0.3))
    x = randn(S, B, HIDDEN)
    dy = randn(S, B, HIDDEN)
    xl = x.clone().requires_grad_(True)
    hs = xl.transpose(0, 1)  # [b, s, h]
    pos = torch.arange(S)[None].expand(B, S)
    cos, sin = rotary(hs, pos)
    mask = torch.full((S, S), torch.finfo(torch.float64).min).triu(1)[None, None].expand(B, 1, S, S)
    y, _ = attn(hs, (cos, sin), mask)
    y = y.transpose(0, 1)
    (y * dy).sum().backward()

    dqk = NOPE + ROPE
    out = {"x": x, "dy": dy, "y": y.detach(), "dx": xl.grad}
    for hf, ours in names.items():
        w, g = getattr(attn, hf).weight.detach(), getattr(attn, hf).weight.grad
        if interleave and ours in ("q_up", "query"):
            w, g = (deinterleave_rows(t, H, dqk, NOPE, ROPE) for t in (w, g))
        if interleave and ours == "kv_down":
            w, g = (deinterleave_rows(t, 1, KV_RANK + ROPE, KV_RANK, ROPE) for t in (w, g))
        out[ours] = w
        out["grad." + ours] = g
    meta = {"hidden": HIDDEN, "heads": H, "q_lora_rank": q_lora_rank or 0, "kv_lora_rank": KV_RANK,
            "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": V,
            "rope_theta": rope_parameters["rope_theta"], "norm_epsilon": 1e-6,
            "rope_interleave": int(interleave), "rope_type": rope_parameters["rope_type"]}
    if rope_parameters["rope_type"] == "yarn":
        for key in ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale",
                    "mscale_all_dim"):
            meta[key] = rope_parameters[key]
    write_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), out, meta)
    print(name, "y", float(y.abs().max()), "dx", float(xl.grad.abs().max()))


def main():
    default = {"rope_type": "default", "rope_theta": 10000.0}
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 4,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 0.707, "mscale_all_dim": 0.707}
    make("mla_q_lora", 1, 12, default, False)
    make("mla_plain_q_yarn", 2, None, yarn, False)
    make("mla_q_lora_yarn_interleave", 3, 12, yarn, True)


if __name__ == "__main__":
    main()
