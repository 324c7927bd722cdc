#!/usr/bin/python3
"""Muon reference (torch.optim.Muon's recipe, Newton-Schulz in fp32) for tests/mpi/test_muon.cpp.

Five optimizer steps on the parameters of make_fixtures.py's tiny GPT "b" (GQA, SwiGLU with separate
gate and up, RMSNorm, RoPE, untied output layer): each step's gradients are those of the GPT's mean
loss on a fresh batch at the current parameters (make_fixtures.gpt_forward in float64, rounded to
fp32), then one update in plain fp32 PyTorch:
  - the global gradient norm over all parameters, clipped to clip_grad (coefficient
    clip / (norm + 1e-6), as libparallel's clip_coefficient);
  - Muon for the 2-D hidden weights (attention query/key/value/proj, MLP gate/up/fc2), with
    torch.optim.Muon's update: buf.lerp_(g, 1 - mu); u = g.lerp(buf, mu) (Nesterov);
    O = NS5(u) with (3.4445, -4.7750, 2.0315), X / max(||X||_F, 1e-7) first, tall matrices
    transposed; W *= 1 - lr wd; W -= lr * 0.2 * sqrt(max(A, B)) * O (Moonlight's match_rms_adamw);
  - torch.optim.AdamW (single-tensor) for the rest: embedding, output layer (decayed, 2-D) and
    norms (not decayed).
The only difference from torch.optim.Muon is the dtype of the Newton-Schulz iteration (torch: bf16);
main() first checks that this implementation with NS in bf16 reproduces torch.optim.Muon exactly.

Writes tests/reference/fixtures/muon.safetensors:
  "init." + name      the initial fp32 parameters
  "grad{t}." + name   the gradients given at step t = 1..5
  "step{t}." + name   the parameters after step t
  metadata: the GPT config, lrs, momentum, nesterov, ns_steps, betas, eps, weight_decay, clip_grad
Deterministic (fixed seed). Run: PYTHONPATH=/tmp/torch2 python3 tests/reference/make_muon_fixture.py
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as mf  # noqa: E402  (sets the default dtype to float64)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "muon.safetensors")
NS = (3.4445, -4.7750, 2.0315)
LRS = [1e-2, 2e-2, 2e-2, 1.5e-2, 1e-2]
MOMENTUM, NS_STEPS, WD, BETAS, EPS, CLIP = 0.95, 5, 0.1, (0.9, 0.95), 1e-8, 1.0


def muon_parameter(name, t):
    return t.dim() == 2 and not name.startswith("embedding.") and not name.startswith("output.")


def newton_schulz(g, steps, dtype):
    """torch.optim.Muon's _zeropower_via_newtonschulz with the iteration in `dtype`."""
    a, b, c = NS
    x = g.to(dtype=dtype, copy=True)
    if g.size(0) > g.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=1e-7))
    for _ in range(steps):
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, poly, x, beta=a)
    if g.size(0) > g.size(1):
        x = x.T
    return x


def muon_update(param, grad, buf, lr, ns_dtype, scale):
    buf.lerp_(grad, 1 - MOMENTUM)
    u = grad.lerp(buf, MOMENTUM)
    o = newton_schulz(u, NS_STEPS, ns_dtype)
    A, B = param.shape
    adjusted = lr * (0.2 * math.sqrt(max(A, B)) if scale == "match_rms_adamw" else math.sqrt(max(1, A / B)))
    param.mul_(1 - lr * WD)
    param.add_(o, alpha=-adjusted)


def check_against_torch_muon():
    """This update with NS in bf16 is torch.optim.Muon's, bit for bit (both scale rules)."""
    torch.manual_seed(1)
    for shape, scale in (((24, 40), "match_rms_adamw"), ((40, 24), "original")):
        w = torch.randn(*shape, dtype=torch.float32)
        ref = w.clone().requires_grad_(True)
        opt = torch.optim.Muon([ref], lr=0.02, weight_decay=WD, momentum=MOMENTUM, nesterov=True,
                               ns_steps=NS_STEPS, adjust_lr_fn=scale)
        mine, buf = w.clone(), torch.zeros_like(w)
        for _ in range(3):
            g = torch.randn(*shape, dtype=torch.float32)
            ref.grad = g.clone()
            opt.step()
            muon_update(mine, g, buf, 0.02, torch.bfloat16, scale)
        assert torch.equal(mine, ref.detach()), (shape, (mine - ref.detach()).abs().max())
    print("the reference update with NS in bf16 equals torch.optim.Muon")


def main():
    check_against_torch_muon()
    torch.manual_seed(20251127)
    cfg = mf.gpt_config("b")
    params = {n: v.to(torch.float32) for n, v in mf.gpt_parameters(cfg).items()}
    names = sorted(params)
    out = {"init." + n: params[n].clone() for n in names}
    bufs = {n: torch.zeros_like(params[n]) for n in names if muon_parameter(n, params[n])}
    adam_names = [n for n in names if n not in bufs]
    adam_params = {n: params[n].clone().requires_grad_(True) for n in adam_names}
    adamw = torch.optim.AdamW(
        [{"params": [adam_params[n] for n in adam_names if adam_params[n].dim() >= 2], "weight_decay": WD},
         {"params": [adam_params[n] for n in adam_names if adam_params[n].dim() < 2], "weight_decay": 0.0}],
        lr=LRS[0], betas=BETAS, eps=EPS, foreach=False)
    b, s, V = 4, cfg["seq_length"], cfg["vocab_size"]
    for t, lr in enumerate(LRS, start=1):
        current = {n: (adam_params[n].detach() if n in adam_params else params[n]) for n in names}
        leaves = {n: current[n].to(torch.float64).clone().requires_grad_(True) for n in names}
        tokens = torch.randint(0, V, (b, s), dtype=torch.int32)
        targets = torch.randint(0, V, (b, s), dtype=torch.int32)
        _, loss = mf.gpt_forward(cfg, leaves, tokens, targets)
        grads = dict(zip(names, torch.autograd.grad(loss, [leaves[n] for n in names])))
        grads = {n: g.to(torch.float32) for n, g in grads.items()}
        norm = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
        coef = min(1.0, CLIP / (norm + 1e-6))
        print(f"step {t}: loss {float(loss):.5f}, grad norm {norm:.5f}, clip coefficient {coef:.5f}")
        for n in names:
            out[f"grad{t}.{n}"] = grads[n].clone()
            g = grads[n] * coef if coef < 1.0 else grads[n]
            if n in bufs:
                muon_update(params[n], g, bufs[n], lr, torch.float32, "match_rms_adamw")
            else:
                adam_params[n].grad = g.clone()
        for group in adamw.param_groups:
            group["lr"] = lr
        adamw.step()
        for n in names:
            out[f"step{t}.{n}"] = (adam_params[n].detach() if n in adam_params else params[n]).clone()
    meta = {k: (str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v))
            for k, v in cfg.items()}
    meta.update(lrs=",".join(repr(x) for x in LRS), momentum=MOMENTUM, nesterov="true", ns_steps=NS_STEPS,
                beta1=BETAS[0], beta2=BETAS[1], eps=EPS, weight_decay=WD, clip_grad=CLIP,
                muon_scale="match_rms_adamw", torch=torch.__version__)
    mf.write_safetensors(OUT, out, meta)


if __name__ == "__main__":
    main()
