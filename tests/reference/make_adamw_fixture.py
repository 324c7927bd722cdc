#!/usr/bin/python3
"""AdamW reference from torch.optim.AdamW (PyTorch 1.13, single-tensor path) for tests/unit/test_adamw.cpp.

Writes tests/reference/fixtures/adamw.safetensors:
  w0, b0                  initial values of a [4, 6] weight (decayed) and a [6] bias (weight_decay 0:
                          libparallel decays only parameters with >= 2 dimensions)
  gw{t}, gb{t}            the gradients given at step t = 1..5
  w{t}, b{t}              the parameters after step t
  metadata: lr{t} per step, betas, eps, weight_decay
Deterministic (fixed seed); run with /usr/bin/python3 tests/reference/make_adamw_fixture.py.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "adamw.safetensors")


def main():
    torch.manual_seed(20240607)
    w = torch.randn(4, 6, dtype=torch.float32) * 0.5
    b = torch.randn(6, dtype=torch.float32) * 0.5
    tensors = {"w0": w.clone(), "b0": b.clone()}
    w = w.clone().requires_grad_(True)
    b = b.clone().requires_grad_(True)
    betas, eps, wd = (0.9, 0.95), 1e-8, 0.1
    opt = torch.optim.AdamW([{"params": [w], "weight_decay": wd}, {"params": [b], "weight_decay": 0.0}],
                            lr=1e-2, betas=betas, eps=eps, foreach=False)
    lrs = [1e-2, 2e-2, 3e-2, 2e-2, 1e-2]
    for t, lr in enumerate(lrs, start=1):
        for group in opt.param_groups:
            group["lr"] = lr
        gw = (torch.randn(4, 6) * (0.1 * t)).float()
        gb = (torch.randn(6) * 0.01).float()
        gw[0, 0] = 0.0  # a zero gradient: the update is decay plus momentum only
        w.grad, b.grad = gw.clone(), gb.clone()
        opt.step()
        tensors[f"gw{t}"], tensors[f"gb{t}"] = gw, gb
        tensors[f"w{t}"], tensors[f"b{t}"] = w.detach().clone(), b.detach().clone()
    meta = {"lrs": ",".join(repr(x) for x in lrs), "beta1": betas[0], "beta2": betas[1], "eps": eps,
            "weight_decay": wd, "torch": torch.__version__}
    write_safetensors(OUT, tensors, meta)
    print("wrote", OUT)


if __name__ == "__main__":
    main()
