#!/usr/bin/env python3
"""Writes the PyTorch reference for context-parallel attention on a long sequence
(tests/reference/fixtures/ring_attention.safetensors; committed, CI has no Python). Run with
`PYTHONPATH=/tmp/torch2 python3 tests/reference/make_ring_attention_fixture.py` (any PyTorch).

Causal grouped-query attention over the whole sequence in float64 autograd (make_fixtures.py's
`attention`, an explicit softmax), on inputs rounded to float32. test_context_parallel cuts q, k, v and
dout into 2c chunks (rank i takes chunks i and 2c-1-i), runs ring attention (p2p) and the K/V all-gather
on its chunks, and checks its rows of out, lse, dq, dk and dv: the log-sum-exp merge of the blocks
and the dK/dV passed back around the ring against one softmax over the whole row.

Tensors: q [s, b, hq, d], k, v [s, b, hkv, d], dout [s, b, hq, d], out [s, b, hq, d], lse [b, hq, s],
dq, dk, dv (objective sum(out * dout)). __metadata__: scale.

Also attention_dv.safetensors: the same tensors for a value head size dv other than the query/key
one (multi-head latent attention: v, out, dout [.., dv]), 32 tokens, GQA, causal, and a softmax
scale that is not 1/sqrt(d) (MLA under YaRN multiplies it by mscale^2). test_context_parallel
checks the one-rank op and every exchange type (p2p, a2a, allgather) against it.
"""

import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import OUT_DIR, attention, leaf, randn, write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)


def main():
    torch.manual_seed(1313)
    s, b, hq, hkv, d = 1024, 1, 2, 1, 8
    scale = 1.0 / math.sqrt(d)
    # std 2 on q and k: sharp rows whose softmax mass sits in a few blocks, so a merge that weighs
    # blocks wrongly shows.
    q, k = leaf(randn(s, b, hq, d, std=2.0)), leaf(randn(s, b, hkv, d, std=2.0))
    v, dout = leaf(randn(s, b, hkv, d)), randn(s, b, hq, d)
    out, lse = attention(q, k, v, True, scale)
    dq, dk, dv = torch.autograd.grad((out * dout).sum(), [q, k, v])
    tensors = {"q": q, "k": k, "v": v, "dout": dout, "out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    path = os.path.join(OUT_DIR, "ring_attention.safetensors")
    write_safetensors(path, {n: t.detach().to(torch.float32) for n, t in tensors.items()}, {"scale": repr(scale)})
    value_head_size()


def value_head_size():
    torch.manual_seed(1414)
    s, b, hq, hkv, d, dv = 32, 2, 4, 2, 24, 16
    scale = 1.3 / math.sqrt(d)
    q, k = leaf(randn(s, b, hq, d, std=2.0)), leaf(randn(s, b, hkv, d, std=2.0))
    v, dout = leaf(randn(s, b, hkv, dv)), randn(s, b, hq, dv)
    out, lse = attention(q, k, v, True, scale)
    dq, dk, dv_ = torch.autograd.grad((out * dout).sum(), [q, k, v])
    tensors = {"q": q, "k": k, "v": v, "dout": dout, "out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv_}
    path = os.path.join(OUT_DIR, "attention_dv.safetensors")
    write_safetensors(path, {n: t.detach().to(torch.float32) for n, t in tensors.items()}, {"scale": repr(scale)})


if __name__ == "__main__":
    main()
