#!/usr/bin/env python3
"""Writes the PyTorch reference of one mixture-of-experts layer (tests/reference/fixtures/moe_*.safetensors;
committed, CI has no Python). Run with `/usr/bin/python3 tests/reference/make_moe_fixture.py`.

Float64 autograd on inputs rounded to float32, as make_fixtures.py. The layer (docs/model.md, "Mixture of
experts"; src/model/moe.cpp):
  logits = x R^T, p = softmax(logits) over the E experts, top-k of p (ties to the lower index),
  capacity (capacity_factor > 0): ceil(cf * T * k / E) assignments per expert, first come (token order,
  then rank within the token's top-k) first kept,
  y[t] = sum over kept (t, e) of p[t, e] * expert_e(x[t]), expert_e(x) = fc2_e act(fc1_e x) (no biases;
  SwiGLU: fc1_e = [gate; up]),
  aux = aux_coeff * E / (k T^2) * sum_e count_e * sum_t p[t, e]   (count_e: top-k assignments, before drops)
  z   = z_coeff / T * sum_t logsumexp(logits_t)^2
  objective = sum(y * dy) + aux + z   (so the gradients include both losses at scale 1).

Tensors: x [s, b, h], router [E, h], fc1 [E, F | 2F, h], fc2 [E, h, F], dy [s, b, h], y, aux [], z [],
tokens_per_expert [E] (I32, before drops), dx, grad.router, grad.fc1, grad.fc2.
__metadata__: num_experts, topk, hidden, ffn, activation, aux_coeff, z_coeff, capacity_factor.

LoRA on the experts (moe_*_lora, docs/lora.md "Experts"): every expert's adapted linears (gate / up / fc1,
fc2) become W x + (alpha / r) B_e (A_e x), A_e [r, in], B_e [out, r]; the base weights are frozen. B is
random here (not PEFT's zeros) so that every adapter gradient is non-zero. Extra tensors, per adapted
part P: lora_A.P [E, r, in], lora_B.P [E, out, r], grad.lora_A.P, grad.lora_B.P (no base gradients);
metadata lora_rank, lora_alpha, lora_targets (comma-separated, ours: gate, up, fc1, fc2).
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT_DIR, gelu_tanh, leaf, randn, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)


def moe_layer(x, router, fc1, fc2, topk, activation, aux_coeff, z_coeff, capacity_factor, lora=None):
    """lora: None, or (scale, {part: (A [E, r, in], B [E, out, r])}) with parts among gate, up, fc1, fc2."""
    s, b, h = x.shape
    E = router.shape[0]
    xr = x.reshape(s * b, h)
    T = xr.shape[0]
    logits = xr @ router.t()
    p = torch.softmax(logits, dim=-1)
    choice = torch.topk(p.detach(), topk, dim=-1).indices  # [T, k]
    counts = torch.zeros(E, dtype=torch.int64)
    for e in choice.flatten().tolist():
        counts[e] += 1
    capacity = math.ceil(capacity_factor * T * topk / E) if capacity_factor > 0 else T * topk
    kept = torch.zeros(E, dtype=torch.int64)
    y = torch.zeros_like(xr)
    for t in range(T):
        for j in range(topk):
            e = int(choice[t, j])
            if kept[e] >= capacity:
                continue
            kept[e] += 1
            pre = fc1[e] @ xr[t]
            names = ["gate", "up"] if activation == "swiglu" else ["fc1"]
            f = pre.shape[0] // len(names)
            if lora is not None:
                scale, ad = lora
                pre = torch.cat([pre[j * f:(j + 1) * f] + (scale * ad[n][1][e] @ (ad[n][0][e] @ xr[t])
                                                           if n in ad else 0) for j, n in enumerate(names)])
            if activation == "swiglu":
                act = torch.nn.functional.silu(pre[:f]) * pre[f:]
            else:
                act = gelu_tanh(pre)
            out = fc2[e] @ act
            if lora is not None and "fc2" in lora[1]:
                out = out + lora[0] * lora[1]["fc2"][1][e] @ (lora[1]["fc2"][0][e] @ act)
            y = y.index_add(0, torch.tensor([t]), (p[t, e] * out).unsqueeze(0))
    aux = aux_coeff * E / (topk * T * T) * (counts.to(p.dtype) * p.sum(0)).sum()
    z = z_coeff / T * (torch.logsumexp(logits, dim=-1) ** 2).sum()
    return y.reshape(s, b, h), aux, z, counts


def make(name, seed, s, b, h, E, F, topk, activation, aux_coeff, z_coeff, capacity_factor):
    torch.manual_seed(seed)
    x = leaf(randn(s, b, h))
    router = leaf(randn(E, h, std=0.5))
    rows = 2 * F if activation == "swiglu" else F
    fc1 = leaf(randn(E, rows, h, std=0.3))
    fc2 = leaf(randn(E, h, F, std=0.3))
    dy = randn(s, b, h)
    y, aux, z, counts = moe_layer(x, router, fc1, fc2, topk, activation, aux_coeff, z_coeff, capacity_factor)
    ((y * dy).sum() + aux + z).backward()
    tensors = {
        "x": x, "router": router, "fc1": fc1, "fc2": fc2, "dy": dy, "y": y,
        "aux": aux.reshape(()), "z": z.reshape(()), "tokens_per_expert": counts,
        "dx": x.grad, "grad.router": router.grad, "grad.fc1": fc1.grad, "grad.fc2": fc2.grad,
    }
    meta = dict(num_experts=E, topk=topk, hidden=h, ffn=F, activation=activation, aux_coeff=aux_coeff,
                z_coeff=z_coeff, capacity_factor=capacity_factor)
    write_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), tensors, meta)


def make_lora(name, seed, s, b, h, E, F, topk, activation, rank, alpha, targets):
    """One MoE layer with LoRA on its experts' `targets`, base frozen (gradients of x and the adapters)."""
    torch.manual_seed(seed)
    x = leaf(randn(s, b, h))
    router = randn(E, h, std=0.5)
    rows = 2 * F if activation == "swiglu" else F
    fc1 = randn(E, rows, h, std=0.3)
    fc2 = randn(E, h, F, std=0.3)
    dy = randn(s, b, h)
    ad = {}
    for part in targets:
        fan_in, fan_out = (F, h) if part == "fc2" else (h, F)
        ad[part] = (leaf(randn(E, rank, fan_in, std=0.3)), leaf(randn(E, fan_out, rank, std=0.3)))
    scale = alpha / rank
    y, aux, z, counts = moe_layer(x, router, fc1, fc2, topk, activation, 0.01, 0.001, 0.0, lora=(scale, ad))
    ((y * dy).sum() + aux + z).backward()
    tensors = {"x": x, "router": router, "fc1": fc1, "fc2": fc2, "dy": dy, "y": y, "aux": aux.reshape(()),
               "z": z.reshape(()), "tokens_per_expert": counts, "dx": x.grad}
    for part, (a, bb) in ad.items():
        tensors.update({"lora_A." + part: a, "lora_B." + part: bb, "grad.lora_A." + part: a.grad,
                        "grad.lora_B." + part: bb.grad})
    meta = dict(num_experts=E, topk=topk, hidden=h, ffn=F, activation=activation, aux_coeff=0.01, z_coeff=0.001,
                capacity_factor=0.0, lora_rank=rank, lora_alpha=alpha, lora_targets=",".join(targets))
    write_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), tensors, meta)


if __name__ == "__main__":
    # Dropless top-2 GeLU experts with both losses; top-1 SwiGLU experts with capacity 1 (drops).
    make("moe_gelu_top2", 7, s=6, b=2, h=16, E=4, F=24, topk=2, activation="gelu", aux_coeff=0.1,
         z_coeff=0.01, capacity_factor=0.0)
    make("moe_swiglu_top1_capacity", 8, s=6, b=2, h=16, E=4, F=12, topk=1, activation="swiglu",
         aux_coeff=0.05, z_coeff=0.02, capacity_factor=1.0)
    # LoRA on the experts: SwiGLU top-2 with gate, up and fc2 adapted; GeLU top-1 with fc1 only.
    make_lora("moe_swiglu_top2_lora", 9, s=6, b=2, h=16, E=4, F=12, topk=2, activation="swiglu", rank=2,
              alpha=4.0, targets=["gate", "up", "fc2"])
    make_lora("moe_gelu_top1_lora", 10, s=6, b=2, h=16, E=4, F=12, topk=1, activation="gelu", rank=3,
              alpha=3.0, targets=["fc1"])
