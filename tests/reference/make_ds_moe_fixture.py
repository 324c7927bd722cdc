#!/usr/bin/env python3
"""Writes the references of one MoE layer with the routing options of src/model/router.hpp
(tests/reference/fixtures/moe_route_*.safetensors; committed, CI has no Python). Run with
`PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/make_ds_moe_fixture.py` (transformers 5.x
for the Hugging Face blocks; without it the HF part is skipped and the `hf.*` tensors are not written).

Two references per case, both from the same weights (inputs rounded to float32):
  1. our own float64 autograd of router.hpp's formulas: scores (softmax | sigmoid), the bias-corrected
     choice with group-limited routing, combine weights (normalised over the top k, times
     routed_scaling_factor), SwiGLU experts, the Switch aux, the sequence-wise aux (DeepSeek-V3) and z
     losses; objective = sum(y * dy) + aux + seq_aux + z. Also the assignments per expert and the bias
     after one update: bias + speed * sign(mean load - load).
  2. Hugging Face's own block (DeepseekV3MoE, Qwen3MoeSparseMoeBlock, MixtralSparseMoeBlock) loaded with
     the same weights (shared experts zeroed), objective sum(y * dy): `hf.y`, `hf.dx`, `hf.grad.*`.
     HF runs its router in float32 (as it does in training), so these hold float32 rounding.

Tensors: x [s, b, h], router [E, h], bias [E], fc1 [E, 2F, h] (gate then up), fc2 [E, h, F], dy, y, aux, seq_aux,
z, tokens_per_expert [E], bias_after [E], dx, grad.router, grad.fc1, grad.fc2 (and hf.*).
__metadata__: num_experts, topk, hidden, ffn, score_function, norm_topk_prob, routed_scaling_factor, n_group,
topk_group, expert_bias, bias_update_speed, aux_coeff, seq_aux_coeff, z_coeff, hf_block.
"""

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT_DIR, leaf, randn, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)


def route(logits, bias, o):
    """router.hpp's routing: (choice [T, k], weights [T, k], scores [T, E])."""
    T, E = logits.shape
    s = torch.sigmoid(logits) if o["score_function"] == "sigmoid" else torch.softmax(logits, dim=-1)
    c = s.detach() + bias
    G = o["n_group"]
    if G > 1:
        group_scores = c.view(T, G, E // G).topk(2, dim=-1)[0].sum(-1)
        groups = group_scores.topk(o["topk_group"], dim=-1)[1]
        mask = torch.zeros(T, G, dtype=torch.bool)
        mask.scatter_(1, groups, True)
        c = c.masked_fill(~mask.unsqueeze(-1).expand(T, G, E // G).reshape(T, E), float("-inf"))
    choice = c.topk(o["topk"], dim=-1)[1]
    w = s.gather(1, choice)
    if o["norm_topk_prob"]:
        w = w / w.sum(-1, keepdim=True)
    return choice, w * o["routed_scaling_factor"], s


def moe_layer(x, router, bias, fc1, fc2, o):
    s_len, b, h = x.shape
    E = router.shape[0]
    k = o["topk"]
    xr = x.reshape(-1, h)
    T = xr.shape[0]
    logits = xr @ router.t()
    choice, w, s = route(logits, bias, o)
    F = fc2.shape[2]
    y = torch.zeros_like(xr)
    for t in range(T):
        for j in range(k):
            e = int(choice[t, j])
            pre = fc1[e] @ xr[t]
            act = torch.nn.functional.silu(pre[:F]) * pre[F:]
            y = y.index_add(0, torch.tensor([t]), (w[t, j] * (fc2[e] @ act)).unsqueeze(0))
    counts = torch.zeros(E, dtype=torch.int64)
    for e in choice.flatten().tolist():
        counts[e] += 1
    # The balance losses see s' = s / sum s for sigmoid scores (s for softmax).
    sn = s / s.sum(-1, keepdim=True) if o["score_function"] == "sigmoid" else s
    aux = o["aux_coeff"] * E / (k * T * T) * (counts.to(s.dtype) * sn.sum(0)).sum()
    # Sequence-wise (DeepSeek-V3): token t = (position, sample) of [s, b]; per sample f_e P_e.
    seq_counts = torch.zeros(b, E)
    for t in range(T):
        for j in range(k):
            seq_counts[t % b, int(choice[t, j])] += 1
    f = seq_counts * E / (k * s_len)
    P = sn.view(s_len, b, E).mean(0)
    seq_aux = o["seq_aux_coeff"] * (f * P).sum(-1).mean()
    z = o["z_coeff"] / T * (torch.logsumexp(logits, dim=-1) ** 2).sum()
    return y.reshape(s_len, b, h), aux, seq_aux, z, counts


def hf_block(o, router, bias, fc1, fc2, h, F):
    """The Hugging Face block of this routing with our weights, or None without transformers 5."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return None
    E, k = router.shape[0], o["topk"]
    common = dict(hidden_size=h, moe_intermediate_size=F, hidden_act="silu", num_experts_per_tok=k)
    if o["hf_block"] == "deepseek_v3":
        from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
        cfg = DeepseekV3Config(n_routed_experts=E, n_group=o["n_group"], topk_group=o["topk_group"],
                               norm_topk_prob=o["norm_topk_prob"],
                               routed_scaling_factor=o["routed_scaling_factor"], n_shared_experts=1,
                               intermediate_size=F, **common)
        block = DeepseekV3MoE(cfg).double()
        block.gate.e_score_correction_bias.copy_(bias)
        for p in block.shared_experts.parameters():
            torch.nn.init.zeros_(p)
    elif o["hf_block"] == "qwen3_moe":
        from transformers.models.qwen3_moe.configuration_qwen3_moe import Qwen3MoeConfig
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
        cfg = Qwen3MoeConfig(num_experts=E, norm_topk_prob=o["norm_topk_prob"], intermediate_size=F, **common)
        block = Qwen3MoeSparseMoeBlock(cfg).double()
    else:
        from transformers.models.mixtral.configuration_mixtral import MixtralConfig
        from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
        cfg = MixtralConfig(num_local_experts=E, hidden_size=h, intermediate_size=F, hidden_act="silu",
                            num_experts_per_tok=k)
        block = MixtralSparseMoeBlock(cfg).double()
    with torch.no_grad():
        block.gate.weight.copy_(router)
        block.experts.gate_up_proj.copy_(fc1)
        block.experts.down_proj.copy_(fc2)
    return block


def make(name, seed, s, b, h, E, F, o):
    torch.manual_seed(seed)
    x = leaf(randn(s, b, h))
    router = leaf(randn(E, h, std=0.5))
    bias = randn(E, std=0.2) if o["expert_bias"] else torch.zeros(E)
    fc1 = leaf(randn(E, 2 * F, h, std=0.3))
    fc2 = leaf(randn(E, h, F, std=0.3))
    dy = randn(s, b, h)
    y, aux, seq_aux, z, counts = moe_layer(x, router, bias, fc1, fc2, o)
    ((y * dy).sum() + aux + seq_aux + z).backward()
    # One bias update from this forward's load.
    d = counts.sum() - E * counts
    bias_after = bias + o["bias_update_speed"] * torch.sign(d.to(torch.float64))
    tensors = {
        "x": x, "router": router, "bias": bias, "fc1": fc1, "fc2": fc2, "dy": dy, "y": y,
        "aux": aux.reshape(()), "seq_aux": seq_aux.reshape(()), "z": z.reshape(()),
        "tokens_per_expert": counts, "bias_after": bias_after,
        "dx": x.grad, "grad.router": router.grad, "grad.fc1": fc1.grad, "grad.fc2": fc2.grad,
    }
    block = hf_block(o, router.detach(), bias, fc1.detach(), fc2.detach(), h, F)
    if block is not None:
        # HF's layout is [b, s, h]; ours [s, b, h].
        xh = x.detach().transpose(0, 1).contiguous().requires_grad_(True)
        yh = block(xh)
        (yh * dy.transpose(0, 1)).sum().backward()
        tensors.update({
            "hf.y": yh.detach().transpose(0, 1), "hf.dx": xh.grad.transpose(0, 1),
            "hf.grad.router": block.gate.weight.grad, "hf.grad.fc1": block.experts.gate_up_proj.grad,
            "hf.grad.fc2": block.experts.down_proj.grad,
        })
        err = ((yh.detach().transpose(0, 1) - y.detach()).abs().max() / y.detach().abs().max()).item()
        print(f"{name}: Hugging Face {o['hf_block']} vs our float64 reference, y max rel {err:.2e}")
        assert err < 1e-5, "the routing reference disagrees with Hugging Face"
    meta = {k: (int(v) if isinstance(v, bool) else v) for k, v in o.items()}
    meta.update(num_experts=E, hidden=h, ffn=F)
    write_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), tensors, meta)


BASE = dict(topk=2, score_function="softmax", norm_topk_prob=False, routed_scaling_factor=1.0, n_group=1,
            topk_group=1, expert_bias=False, bias_update_speed=0.001, aux_coeff=0.0, seq_aux_coeff=0.0,
            z_coeff=0.0, hf_block="none")

if __name__ == "__main__":
    # DeepSeek-V3: sigmoid scores, 8 experts in 4 groups (best 2 eligible), top-3, a random bias that
    # only chooses, normalised weights scaled by 2.5, the sequence-wise aux loss and a z loss.
    make("moe_route_deepseek_v3", 11, s=6, b=2, h=16, E=8, F=12,
         o=dict(BASE, topk=3, score_function="sigmoid", norm_topk_prob=True, routed_scaling_factor=2.5,
                n_group=4, topk_group=2, expert_bias=True, bias_update_speed=0.01, seq_aux_coeff=0.1,
                z_coeff=0.01, hf_block="deepseek_v3"))
    # Qwen3-MoE: softmax, top-2 normalised (norm_topk_prob), with the Switch aux loss.
    make("moe_route_qwen3_moe", 12, s=6, b=2, h=16, E=8, F=12,
         o=dict(BASE, norm_topk_prob=True, aux_coeff=0.1, hf_block="qwen3_moe"))
    # Mixtral: softmax, top-2 renormalised, no losses.
    make("moe_route_mixtral", 13, s=6, b=2, h=16, E=4, F=12,
         o=dict(BASE, norm_topk_prob=True, hf_block="mixtral"))
