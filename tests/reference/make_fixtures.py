#!/usr/bin/env python3
"""Writes the PyTorch reference fixtures under tests/reference/fixtures/ (committed; CI has no Python).

Run with a Python that has torch (e.g. `/usr/bin/python3 tests/reference/make_fixtures.py`). The math is
plain PyTorch in float64 (autograd for every gradient); inputs are drawn, rounded to float32 first and
then used in float64, so a fixture's only error is the float32 rounding of its outputs. Everything is
written as F32 (floats) or I32 (integer ids) with the minimal safetensors writer below. Deterministic:
torch.manual_seed per fixture.

Fixture files and tensor names (shapes in brackets; conventions of docs/model.md):

  linear.safetensors      y = x W^T + b (ops::gemm / add_bias / bias_backward, Column/RowParallelLinear)
      x [s=4, b=3, in=32], W [out=48, in=32], b [48], y [4, 3, 48], dy [4, 3, 48],
      dx [4, 3, 32] = dy W, dW [48, 32] = dy^T x (rows flattened), db [48] = sum of dy over rows
  layernorm.safetensors   y = (x - mean) / sqrt(var + eps) * w + b over the last dim (biased variance)
      x [4, 3, 32], w [32], b [32], eps [] (0-d), y, dy, dx, dw, db
  rmsnorm.safetensors     y = x / sqrt(mean(x^2) + eps) * w   (no bias)
      x [4, 3, 32], w [32], eps [], y, dy, dx, dw
  gelu.safetensors        tanh approximation: y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
      x [4, 3, 40], y, dy, dx
  swiglu.safetensors      x = [gate | up] along the last dim, y = silu(gate) * up
      x [4, 3, 2*24], y [4, 3, 24], dy [4, 3, 24], dx [4, 3, 48]
  rope.safetensors        NeoX-style rotary embedding: pair (i, i + d/2) rotated by angle
                          (offset + s_index) * theta^(-2i/d); y[i] = x[i] cos - x[i+d/2] sin,
                          y[i+d/2] = x[i+d/2] cos + x[i] sin
      x [s=6, b=2, heads=3, d=8], theta [] (= 500), y (offset 0), dy, dx (offset 0),
      position_offset [] I32 (= 5), y_offset, dx_offset (the same x and dy at that offset)
  attention_gqa_causal.safetensors   softmax(q k^T * scale, causal) v; query head j uses kv head
                          j / (hq / hkv); scale = 1/sqrt(d). s = 70 spans more than one 64-row tile.
      q [s=70, b=2, hq=4, d=8], k, v [70, 2, hkv=2, 8], softmax_scale [], out [70, 2, 4, 8],
      lse [b, hq, s] (log-sum-exp of the scaled, masked scores), dout, dq, dk, dv
  attention_mha.safetensors          the same, non-causal, hq = hkv = 2, d = 16, s = 67, b = 1
  embedding.safetensors   out[s, b] = weight[tokens[b, s]]
      tokens [b=2, s=5] I32 (with repeats), weight [V=20, h=8], out [5, 2, 8], dout, dweight [20, 8]
  cross_entropy.safetensors          loss_i = logsumexp(logits_i) - logits_i[target_i]
      logits [n=6, V=20], targets [6] I32, loss [6], dlogits [6, 20] = (softmax - onehot) / n
                          (the gradient of mean(loss))

  gpt_a.safetensors, gpt_b.safetensors   a whole 2-layer GPT (docs/model.md's forward pass)
      A: MHA (hq = hkv = 4), GeLU, LayerNorm, learned positions, biases, tied embeddings (GPT-2 style)
      B: GQA (hq = 4, hkv = 2), SwiGLU, RMSNorm, RoPE (theta 10000), no biases, untied output layer
      Both: hidden 32, vocab 100 (real; the word embedding / output weights here have 100 rows, not
      the padded Vp), seq 8, batch 2, ffn 64, norm eps 1e-5, no dropout.
      Tensors: every parameter under its global name (e.g. "layers.0.attention.query.weight"),
      "grad." + name for its gradient of the mean loss, tokens [b, s] I32, targets [b, s] I32,
      logits [s, b, 100], loss [] (the mean over the b*s tokens).
      __metadata__: the ModelConfig fields (num_layers, hidden_size, num_attention_heads,
      num_query_groups, ffn_hidden_size, vocab_size, seq_length, max_position_embeddings,
      normalization, activation, position_embedding, add_bias, tie_embeddings, norm_epsilon,
      rope_theta) and micro_batch_size, as strings.
  gpt_a_bf16.safetensors  model A in bf16 with PyTorch's own mixed precision as the reference:
      gpt_a's parameters, tokens and targets, the parameters rounded to bfloat16 (stored as BF16,
      exact), and the model run in float32 under torch.autocast("cpu", dtype=torch.bfloat16) the
      way a PyTorch user writes it (F.embedding, F.layer_norm, F.linear, torch.softmax, F.gelu,
      F.cross_entropy; fp32 parameters that hold bf16 values). Tensors: every parameter (BF16),
      "grad." + name (gradient of the mean loss, stored as BF16: autocast computes the weight
      gradients by bf16 GEMMs, so they are bf16 values before the cast to the fp32 leaf), tokens,
      targets, loss [] (F32). __metadata__ as gpt_a. What autocast rounds (torch 1.13, CPU): the
      GEMMs (linear, q k^T, p v) and their backward run in bf16, with bf16 outputs; softmax and
      GeLU take those bf16 tensors and return bf16 (fp32 inside the kernel); cross-entropy is on
      autocast's fp32 list; layer_norm is not on CPU autocast's lists at all, but its input is the
      residual stream, which stays fp32 (fp32 embedding + bf16 branch promotes to fp32), so the
      norms and residual adds run in fp32. Our bf16 model keeps the residual stream in bf16 and
      the attention probabilities in fp32, so the two round in different places (see
      tests/mpi/test_pytorch_parity.cpp for the tolerance). The generator prints both sides'
      distance from the float64 result on the same bf16 weights.
"""

import json
import math
import os
import struct

import torch

torch.set_default_dtype(torch.float64)
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")


# ---- a minimal safetensors writer --------------------------------------------------------------

def write_safetensors(path, tensors, metadata=None):
    """tensors: name -> torch tensor. bfloat16 tensors are written as BF16, other floats as F32,
    integers as I32."""
    header = {}
    if metadata:
        header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu()
        if t.dtype == torch.bfloat16:  # numpy has no bfloat16: write its bits
            data, dtype = t.contiguous().view(torch.int16).numpy().tobytes(), "BF16"
        else:
            if t.is_floating_point():
                t, dtype = t.to(torch.float32), "F32"
            else:
                t, dtype = t.to(torch.int32), "I32"
            data = t.contiguous().numpy().tobytes()  # little-endian on every machine we run on
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for data in blobs:
            f.write(data)
    print(f"wrote {os.path.relpath(path)} ({os.path.getsize(path)} bytes, {len(tensors)} tensors)")


def randn(*shape, std=1.0):
    """Normal values rounded to float32 (what the fixture stores), held in float64."""
    return (torch.randn(*shape) * std).to(torch.float32).to(torch.float64)


def leaf(t):
    return t.clone().requires_grad_(True)


def scalar(v):
    return torch.tensor(float(v)).to(torch.float32).to(torch.float64)


# ---- reference math (float64) ------------------------------------------------------------------

def layernorm(x, w, b, eps):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * w + b


def rmsnorm(x, w, eps):
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x):
    return x * torch.sigmoid(x)


def swiglu(x):
    f = x.shape[-1] // 2
    return silu(x[..., :f]) * x[..., f:]


def rope(x, theta, offset=0):
    """x: [s, b, heads, d]; NeoX style: pairs (i, i + d/2)."""
    s, d = x.shape[0], x.shape[-1]
    half = d // 2
    inv_freq = torch.tensor([float(theta) ** (-2.0 * i / d) for i in range(half)])
    pos = torch.arange(offset, offset + s, dtype=torch.float64)
    angle = pos[:, None] * inv_freq[None, :]  # [s, d/2]
    cos = torch.cos(angle)[:, None, None, :]
    sin = torch.sin(angle)[:, None, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def attention(q, k, v, causal, scale):
    """q [s, b, hq, d], k [s, b, hkv, d], v [s, b, hkv, dv] -> out [s, b, hq, dv], lse [b, hq, s].
    Explicit softmax; dv may differ from d (MLA)."""
    s, b, hq, d = q.shape
    hkv = k.shape[2]
    group = hq // hkv
    kk = k.repeat_interleave(group, dim=2)  # query head j -> kv head j // group
    vv = v.repeat_interleave(group, dim=2)
    qh, kh, vh = (t.permute(1, 2, 0, 3) for t in (q, kk, vv))  # [b, h, s, d]
    scores = qh @ kh.transpose(-1, -2) * scale  # [b, h, s, s]
    if causal:
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [b, h, s]
    p = torch.exp(scores - lse[..., None])
    out = (p @ vh).permute(2, 0, 1, 3)  # [s, b, h, d]
    return out, lse


def cross_entropy(logits, targets):
    """logits [n, V], targets [n] -> per-token loss [n]."""
    return torch.logsumexp(logits, dim=-1) - logits.gather(1, targets[:, None].long())[:, 0]


def grads(outputs, grad_outputs, inputs):
    return torch.autograd.grad(outputs, inputs, grad_outputs)


# ---- per-op fixtures ---------------------------------------------------------------------------

def fixture_linear():
    torch.manual_seed(1)
    x, W, b = randn(4, 3, 32), randn(48, 32, std=0.2), randn(48, std=0.5)
    dy = randn(4, 3, 48)
    xl, Wl, bl = leaf(x), leaf(W), leaf(b)
    y = xl @ Wl.T + bl
    dx, dW, db = grads(y, dy, (xl, Wl, bl))
    return dict(x=x, W=W, b=b, y=y, dy=dy, dx=dx, dW=dW, db=db)


def fixture_layernorm():
    torch.manual_seed(2)
    x = randn(4, 3, 32) * 2.0 + 0.5
    w, b = 1.0 + randn(32, std=0.3), randn(32, std=0.3)
    eps = scalar(1e-5)
    dy = randn(4, 3, 32)
    xl, wl, bl = leaf(x), leaf(w), leaf(b)
    y = layernorm(xl, wl, bl, eps)
    dx, dw, db = grads(y, dy, (xl, wl, bl))
    return dict(x=x, w=w, b=b, eps=eps, y=y, dy=dy, dx=dx, dw=dw, db=db)


def fixture_rmsnorm():
    torch.manual_seed(3)
    x = randn(4, 3, 32) * 2.0 + 0.5
    w = 1.0 + randn(32, std=0.3)
    eps = scalar(1e-5)
    dy = randn(4, 3, 32)
    xl, wl = leaf(x), leaf(w)
    y = rmsnorm(xl, wl, eps)
    dx, dw = grads(y, dy, (xl, wl))
    return dict(x=x, w=w, eps=eps, y=y, dy=dy, dx=dx, dw=dw)


def fixture_gelu():
    torch.manual_seed(4)
    x = randn(4, 3, 40, std=2.0)
    dy = randn(4, 3, 40)
    xl = leaf(x)
    y = gelu_tanh(xl)
    (dx,) = grads(y, dy, (xl,))
    return dict(x=x, y=y, dy=dy, dx=dx)


def fixture_swiglu():
    torch.manual_seed(5)
    x = randn(4, 3, 48, std=2.0)
    dy = randn(4, 3, 24)
    xl = leaf(x)
    y = swiglu(xl)
    (dx,) = grads(y, dy, (xl,))
    return dict(x=x, y=y, dy=dy, dx=dx)


def fixture_rope():
    torch.manual_seed(6)
    theta, offset = 500.0, 5
    x = randn(6, 2, 3, 8)
    dy = randn(6, 2, 3, 8)
    xl = leaf(x)
    y = rope(xl, theta)
    (dx,) = grads(y, dy, (xl,))
    xl = leaf(x)
    y_off = rope(xl, theta, offset)
    (dx_off,) = grads(y_off, dy, (xl,))
    return dict(x=x, theta=scalar(theta), y=y, dy=dy, dx=dx,
                position_offset=torch.tensor(offset, dtype=torch.int32), y_offset=y_off, dx_offset=dx_off)


def fixture_attention(seed, s, b, hq, hkv, d, causal):
    torch.manual_seed(seed)
    q, k, v = randn(s, b, hq, d), randn(s, b, hkv, d), randn(s, b, hkv, d)
    dout = randn(s, b, hq, d)
    scale = 1.0 / math.sqrt(d)
    ql, kl, vl = leaf(q), leaf(k), leaf(v)
    out, lse = attention(ql, kl, vl, causal, scale)
    dq, dk, dv = grads(out, dout, (ql, kl, vl))
    return dict(q=q, k=k, v=v, softmax_scale=scalar(scale), out=out, lse=lse, dout=dout, dq=dq, dk=dk, dv=dv)


def fixture_embedding():
    torch.manual_seed(8)
    V, h = 20, 8
    tokens = torch.tensor([[3, 7, 3, 19, 0], [7, 7, 12, 1, 3]], dtype=torch.int32)  # [b, s], repeats
    weight = randn(V, h)
    dout = randn(5, 2, h)
    wl = leaf(weight)
    out = wl[tokens.T.long()]  # [s, b, h]
    (dweight,) = grads(out, dout, (wl,))
    return dict(tokens=tokens, weight=weight, out=out, dout=dout, dweight=dweight)


def fixture_cross_entropy():
    torch.manual_seed(9)
    n, V = 6, 20
    logits = randn(n, V, std=3.0)
    targets = torch.tensor([0, 19, 5, 5, 11, 2], dtype=torch.int32)
    ll = leaf(logits)
    loss = cross_entropy(ll, targets)
    (dlogits,) = grads(loss.mean(), None, (ll,))
    return dict(logits=logits, targets=targets, loss=loss, dlogits=dlogits)


# ---- the whole GPT -----------------------------------------------------------------------------

def gpt_config(name):
    common = dict(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64, vocab_size=100,
                  seq_length=8, max_position_embeddings=8, norm_epsilon=1e-5, rope_theta=10000.0,
                  micro_batch_size=2)
    if name == "a":
        return dict(common, num_query_groups=4, normalization="layernorm", activation="gelu",
                    position_embedding="learned", add_bias=True, tie_embeddings=True)
    return dict(common, num_query_groups=2, normalization="rmsnorm", activation="swiglu",
                position_embedding="rope", add_bias=False, tie_embeddings=False)


def gpt_parameters(cfg):
    """Global name -> float32-rounded value in float64. Non-trivial values everywhere (norm weights
    near 1, non-zero biases) so that every term of every gradient is exercised."""
    h, f, V, L = cfg["hidden_size"], cfg["ffn_hidden_size"], cfg["vocab_size"], cfg["num_layers"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_query_groups"]
    d = h // hq
    ln = cfg["normalization"] == "layernorm"
    bias = cfg["add_bias"]
    p = {"embedding.word.weight": randn(V, h, std=0.5)}
    if cfg["position_embedding"] == "learned":
        p["embedding.position.weight"] = randn(cfg["max_position_embeddings"], h, std=0.3)

    def norm(prefix):
        p[prefix + ".weight"] = 1.0 + randn(h, std=0.2)
        if ln:
            p[prefix + ".bias"] = randn(h, std=0.1)

    def linear(prefix, out, inp, std):
        p[prefix + ".weight"] = randn(out, inp, std=std)
        if bias:
            p[prefix + ".bias"] = randn(out, std=0.1)

    for i in range(L):
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
    norm("final_norm")
    if not cfg["tie_embeddings"]:
        p["output.weight"] = randn(V, h, std=0.3)
    return p


def gpt_forward(cfg, p, tokens, targets):
    """docs/model.md's forward pass. tokens, targets [b, s] -> (logits [s, b, V], mean loss)."""
    h, L = cfg["hidden_size"], cfg["num_layers"]
    hq, hkv = cfg["num_attention_heads"], cfg["num_query_groups"]
    d = h // hq
    eps = cfg["norm_epsilon"]
    b, s = tokens.shape

    def norm(prefix, x):
        if cfg["normalization"] == "layernorm":
            return layernorm(x, p[prefix + ".weight"], p[prefix + ".bias"], eps)
        return rmsnorm(x, p[prefix + ".weight"], eps)

    def linear(prefix, x):
        y = x @ p[prefix + ".weight"].T
        if cfg["add_bias"]:
            y = y + p[prefix + ".bias"]
        return y

    x = p["embedding.word.weight"][tokens.T.long()]  # [s, b, h]
    if cfg["position_embedding"] == "learned":
        x = x + p["embedding.position.weight"][:s][:, None, :]
    for i in range(L):
        pre = f"layers.{i}"
        a = norm(pre + ".input_norm", x)
        q = linear(pre + ".attention.query", a).view(s, b, hq, d)
        k = linear(pre + ".attention.key", a).view(s, b, hkv, d)
        v = linear(pre + ".attention.value", a).view(s, b, hkv, d)
        if cfg["position_embedding"] == "rope":
            q, k = rope(q, cfg["rope_theta"]), rope(k, cfg["rope_theta"])
        o, _ = attention(q, k, v, causal=True, scale=1.0 / math.sqrt(d))
        x = x + linear(pre + ".attention.proj", o.reshape(s, b, hq * d))
        m = norm(pre + ".post_attention_norm", x)
        if cfg["activation"] == "gelu":
            u = gelu_tanh(linear(pre + ".mlp.fc1", m))
        else:
            u = silu(linear(pre + ".mlp.gate", m)) * linear(pre + ".mlp.up", m)
        x = x + linear(pre + ".mlp.fc2", u)
    xf = norm("final_norm", x)
    w_out = p["embedding.word.weight"] if cfg["tie_embeddings"] else p["output.weight"]
    logits = xf @ w_out.T  # [s, b, V]
    loss = cross_entropy(logits.reshape(s * b, -1), targets.T.reshape(-1)).mean()
    return logits, loss


def fixture_gpt(name, seed):
    torch.manual_seed(seed)
    cfg = gpt_config(name)
    params = {k: leaf(v) for k, v in gpt_parameters(cfg).items()}
    b, s, V = cfg["micro_batch_size"], cfg["seq_length"], cfg["vocab_size"]
    tokens = torch.randint(0, V, (b, s), dtype=torch.int32)
    targets = torch.randint(0, V, (b, s), dtype=torch.int32)
    logits, loss = gpt_forward(cfg, params, tokens, targets)
    names = sorted(params)
    g = torch.autograd.grad(loss, [params[n] for n in names])
    out = {n: params[n] for n in names}
    out.update({"grad." + n: gn for n, gn in zip(names, g)})
    out.update(tokens=tokens, targets=targets, logits=logits, loss=loss)
    meta = {k: (str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v))
            for k, v in cfg.items()}
    return out, meta


def gpt_forward_autocast(cfg, p, tokens, targets):
    """Model A (GPT-2 style) as a PyTorch user writes it, to run under torch.autocast: the same
    math as gpt_forward, with PyTorch's ops, so that autocast decides what runs in bf16."""
    import torch.nn.functional as F
    assert cfg["normalization"] == "layernorm" and cfg["activation"] == "gelu" and cfg["add_bias"]
    assert cfg["position_embedding"] == "learned" and cfg["tie_embeddings"]
    h, L, hq = cfg["hidden_size"], cfg["num_layers"], cfg["num_attention_heads"]
    assert cfg["num_query_groups"] == hq
    d, eps = h // hq, cfg["norm_epsilon"]
    b, s = tokens.shape

    def ln(prefix, x):
        return F.layer_norm(x, (h,), p[prefix + ".weight"], p[prefix + ".bias"], eps)

    def linear(prefix, x):
        return F.linear(x, p[prefix + ".weight"], p[prefix + ".bias"])

    x = F.embedding(tokens.T.long(), p["embedding.word.weight"]) + p["embedding.position.weight"][:s][:, None, :]
    mask = torch.ones(s, s, dtype=torch.bool).triu(1)
    for i in range(L):
        pre = f"layers.{i}"
        a = ln(pre + ".input_norm", x)
        q, k, v = (linear(pre + ".attention." + n, a).view(s, b, hq, d).permute(1, 2, 0, 3)
                   for n in ("query", "key", "value"))  # [b, h, s, d]
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(d))
        probs = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1)
        o = (probs @ v).permute(2, 0, 1, 3).reshape(s, b, h)
        x = x + linear(pre + ".attention.proj", o)
        m = ln(pre + ".post_attention_norm", x)
        x = x + linear(pre + ".mlp.fc2", F.gelu(linear(pre + ".mlp.fc1", m), approximate="tanh"))
    logits = F.linear(ln("final_norm", x), p["embedding.word.weight"])  # [s, b, V]
    loss = F.cross_entropy(logits.reshape(s * b, -1), targets.T.reshape(-1).long())
    return logits, loss


def fixture_gpt_bf16(name, seed):
    """gpt_<name>'s parameters and data, rounded to bf16, under PyTorch's bf16 autocast."""
    torch.manual_seed(seed)  # the same draws as fixture_gpt(name, seed)
    cfg = gpt_config(name)
    values = {k: v.to(torch.bfloat16) for k, v in gpt_parameters(cfg).items()}
    b, s, V = cfg["micro_batch_size"], cfg["seq_length"], cfg["vocab_size"]
    tokens = torch.randint(0, V, (b, s), dtype=torch.int32)
    targets = torch.randint(0, V, (b, s), dtype=torch.int32)
    names = sorted(values)

    def run(dtype, autocast):
        params = {k: leaf(v.to(dtype)) for k, v in values.items()}
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            _, loss = gpt_forward_autocast(cfg, params, tokens, targets)
        return loss, torch.autograd.grad(loss, [params[n] for n in names])

    loss, g = run(torch.float32, True)
    loss64, g64 = run(torch.float64, False)  # the exact result on the same weights, for the record
    # The key bias's exact gradient is 0 (softmax ignores a shift of a query's scores): skipped here.
    err = max(float((a.double() - e).abs().max() / e.abs().max())
              for n, a, e in zip(names, g, g64) if not n.endswith("attention.key.bias"))
    print(f"gpt_{name}_bf16: autocast loss {float(loss):.6f} vs float64 {float(loss64):.6f} "
          f"(rel {abs(float(loss) - float(loss64)) / float(loss64):.2e}), worst gradient error relative "
          f"to its max {err:.2e}")
    out = {n: values[n] for n in names}
    out.update({"grad." + n: gn.to(torch.bfloat16) for n, gn in zip(names, g)})
    out.update(tokens=tokens, targets=targets, loss=loss.float())
    meta = {k: (str(v).lower() if isinstance(v, bool) else repr(v) if isinstance(v, float) else str(v))
            for k, v in cfg.items()}
    return out, meta


def main():
    fixtures = {
        "linear": fixture_linear(),
        "layernorm": fixture_layernorm(),
        "rmsnorm": fixture_rmsnorm(),
        "gelu": fixture_gelu(),
        "swiglu": fixture_swiglu(),
        "rope": fixture_rope(),
        "attention_gqa_causal": fixture_attention(7, s=70, b=2, hq=4, hkv=2, d=8, causal=True),
        "attention_mha": fixture_attention(17, s=67, b=1, hq=2, hkv=2, d=16, causal=False),
        "embedding": fixture_embedding(),
        "cross_entropy": fixture_cross_entropy(),
    }
    for name, tensors in fixtures.items():
        write_safetensors(os.path.join(OUT_DIR, name + ".safetensors"), tensors)
    for name, seed in (("a", 101), ("b", 102)):
        tensors, meta = fixture_gpt(name, seed)
        write_safetensors(os.path.join(OUT_DIR, f"gpt_{name}.safetensors"), tensors, meta)
    tensors, meta = fixture_gpt_bf16("a", 101)
    write_safetensors(os.path.join(OUT_DIR, "gpt_a_bf16.safetensors"), tensors, meta)


if __name__ == "__main__":
    main()
