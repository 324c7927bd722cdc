#!/usr/bin/env python3
"""Writes the Hugging Face Llama-family fixtures of tests/scripts/hf_llama.sh (committed; CI has no Python).

Run with a Python that has torch: `/usr/bin/python3 tests/reference/make_hf_llama.py` (transformers is
not needed: the models are written out here in plain PyTorch).

Three tiny models that follow transformers' LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM
exactly, with their tensor names ("model.layers.{i}.self_attn.q_proj.weight", ...):
  - RMSNorm: x * rsqrt(mean(x^2) + eps) * weight
  - rotary embedding as transformers' apply_rotary_pos_emb: inv_freq = theta^(-2i/d), cos/sin of
    cat(freqs, freqs), x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x[d/2:], x[:d/2])
    (the half-split layout, not interleaved pairs)
  - grouped-query attention via repeat_kv (query head j uses kv head j // (hq / hkv)), 1/sqrt(d),
    causal; SwiGLU MLP down(silu(gate(x)) * up(x)); no dropout
  - Qwen2: biases on q_proj, k_proj, v_proj only
          llama                 mistral               qwen2
  layers  2                     2                     2
  hidden  24                    24                    24
  heads   4 (d 6), kv heads 2   6 (d 4), kv heads 2   4 (d 6), kv heads 2
  ffn     32                    40                    32
  vocab   48                    48                    48
  theta   500000                1000000               1000 (see below)
  eps     1e-5                  1e-6                  1e-6
  tied    no                    no                    yes (no lm_head in the file, as HF saves it)
and a fourth, "llama3": a LlamaForCausalLM with hidden 32, 4 heads (d 8), 2 kv heads, ffn 40, theta
10000 and Llama 3.1's rope_scaling {"rope_type": "llama3", factor 8, low_freq_factor 1,
high_freq_factor 32, original_max_position_embeddings 256}: inv_freq scaled as transformers'
_compute_llama3_parameters (kept / blended / divided by factor by wavelength band; the short original
context puts one pair of the 8-token window in each band). The script checks that dropping the
scaling changes the loss.

Weights are drawn larger than a trained model's init (normal(0, 1/sqrt(fan_in)), the embedding normal(0, 1)
(tied: normal(0, 1/sqrt(h))), norm weights 1 +
normal(0, 0.1), biases normal(0, 0.1)) so that attention scores are O(1): then a wrong rotary layout,
a wrong kv-head grouping or a dropped bias changes the loss at the 1e-2 level, not at 1e-6 (the
script checks that interleaved-pair rotary gives a different loss). Values are rounded to float32;
training runs in float64 (like make_hf_gpt2.py), so the only error of a fixture is its final rounding.

Conditioning: Adam divides each gradient element by its own magnitude, so an element whose exact
gradient is ~1e-8 of its tensor's largest moves by up to lr on float32 rounding noise alone, and
later steps spread that into the loss. A fixture with such elements cannot be matched by any float32
trainer, PyTorch's included. The script therefore also trains each model in float32 PyTorch and
requires that run to stay within 1e-6 of the float64 losses and 2e-5 of the weights (relative to
each tensor's largest value). Qwen2's theta is 1000 for that reason: with theta 1e6 and head dim 6,
the slowest rotary pair barely turns over 8 positions, the key bias's component along it has a
near-zero gradient (a shift of all scores of a query), and float32 PyTorch itself misses the float64
loss by 1e-5 at step 3.

Training: 3 steps of torch.optim.AdamW (lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1 on the
>= 2-dim parameters only; constant lr, no clipping) on the mean token cross-entropy. Step t's batch
is samples 2t and 2t+1 of one 49-token document cut into 8-token windows with the next token as
target: exactly what our GPTDataset draws from hf_tokens_text_document (unshuffled, split 1,0,0,
seq_length 8, global batch 2).

Two more models have sliding windows smaller than the 8-token sequence, as issue 27 asks: "mistral_window"
(the mistral shape, sliding_window 3 on every layer) and "qwen2_window" (the qwen2 shape,
use_sliding_window with sliding_window 3 and max_window_layers 1: layer 0 global, layer 1 windowed, as
transformers' layer_types say). A query at position i sees keys j with i - window < j <= i. When
transformers is importable (PYTHONPATH=/tmp/hf5:/tmp/torch2), the script checks that transformers' own
model (eager attention) gives the same loss on the initial weights, and that the window matters.
`make_hf_llama.py mistral_window qwen2_window` writes only those (the others are left as committed).

Files (tests/reference/fixtures/):
  hf_tokens_text_document.{bin,idx}  the document (Megatron indexed dataset, uint16 tokens)
  hf_{llama,mistral,qwen2,llama3}_tiny/  the initial model as an HF folder: config.json, model.safetensors
                                     (F32, metadata {"format": "pt"})
  hf_{llama,mistral,qwen2,llama3}_tiny_after3.safetensors   every model tensor after the 3 updates under its
                                     HF name, losses [3] (each step's mean loss before its update),
                                     tokens / targets [3, 2, 8] I32
  hf_llama_tiny_bf16/                the initial Llama rounded to bfloat16, as a sharded folder:
                                     model-00001-of-00002.safetensors, model-00002-of-00002.safetensors,
                                     model.safetensors.index.json, config.json (torch_dtype bfloat16)
"""

import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402  (the same minimal writer)

torch.set_default_dtype(torch.float64)
OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")

BATCH, SEQ, STEPS = 2, 8, 3
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1
VOCAB = 48

MODELS = {
    "llama": dict(arch="LlamaForCausalLM", model_type="llama", layers=2, hidden=24, heads=4, kv=2, ffn=32,
                  theta=500000.0, eps=1e-5, tied=False, qkv_bias=False, seed=101),
    "mistral": dict(arch="MistralForCausalLM", model_type="mistral", layers=2, hidden=24, heads=6, kv=2,
                    ffn=40, theta=1000000.0, eps=1e-6, tied=False, qkv_bias=False, seed=202),
    "qwen2": dict(arch="Qwen2ForCausalLM", model_type="qwen2", layers=2, hidden=24, heads=4, kv=2, ffn=32,
                  theta=1000.0, eps=1e-6, tied=True, qkv_bias=True, seed=303),
    # Llama 3.1's rope_scaling, with a short original context so that the 8-token window sees all
    # three bands: head dim 8, theta 1e4 -> wavelengths 6.3 (< 256/32: kept), 63 (between: blended),
    # 628 and 6283 (> 256/1: divided by 8).
    "llama3": dict(arch="LlamaForCausalLM", model_type="llama", layers=2, hidden=32, heads=4, kv=2, ffn=40,
                   theta=10000.0, eps=1e-5, tied=False, qkv_bias=False, seed=404,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 32.0, "original_max_position_embeddings": 256}),
    "mistral_window": dict(arch="MistralForCausalLM", model_type="mistral", layers=2, hidden=24, heads=6, kv=2,
                           ffn=40, theta=1000000.0, eps=1e-6, tied=False, qkv_bias=False, seed=505, window=3),
    # Its seed is one whose key biases are well conditioned (see Conditioning): a key bias's
    # gradient is nearly a constant shift of a row's scores, more so under a 3-token window.
    "qwen2_window": dict(arch="Qwen2ForCausalLM", model_type="qwen2", layers=2, hidden=24, heads=4, kv=2, ffn=32,
                         theta=1000.0, eps=1e-6, tied=True, qkv_bias=True, seed=609, window=3,
                         max_window_layers=1),
}


def layer_window(m, i):
    """The layer's window (0: global), as transformers' layer_types."""
    if not m.get("window") or i < m.get("max_window_layers", 0):
        return 0
    return m["window"]


def f32(t):
    """Rounded to float32, held in float64."""
    return t.to(torch.float32).to(torch.float64)


def init_params(m):
    torch.manual_seed(m["seed"])
    h, d = m["hidden"], m["hidden"] // m["heads"]
    p = {}

    def linear(out_f, in_f):
        return f32(torch.randn(out_f, in_f) / math.sqrt(in_f))

    def norm_weight(n):
        return f32(1.0 + 0.1 * torch.randn(n))

    # Tied, the embedding is also the output layer: 1/sqrt(h) keeps the logits O(1).
    p["model.embed_tokens.weight"] = f32(torch.randn(VOCAB, h) / (math.sqrt(h) if m["tied"] else 1.0))
    for i in range(m["layers"]):
        pre = f"model.layers.{i}."
        p[pre + "input_layernorm.weight"] = norm_weight(h)
        p[pre + "self_attn.q_proj.weight"] = linear(m["heads"] * d, h)
        p[pre + "self_attn.k_proj.weight"] = linear(m["kv"] * d, h)
        p[pre + "self_attn.v_proj.weight"] = linear(m["kv"] * d, h)
        if m["qkv_bias"]:
            p[pre + "self_attn.q_proj.bias"] = f32(0.1 * torch.randn(m["heads"] * d))
            p[pre + "self_attn.k_proj.bias"] = f32(0.1 * torch.randn(m["kv"] * d))
            p[pre + "self_attn.v_proj.bias"] = f32(0.1 * torch.randn(m["kv"] * d))
        p[pre + "self_attn.o_proj.weight"] = linear(h, m["heads"] * d)
        p[pre + "post_attention_layernorm.weight"] = norm_weight(h)
        p[pre + "mlp.gate_proj.weight"] = linear(m["ffn"], h)
        p[pre + "mlp.up_proj.weight"] = linear(m["ffn"], h)
        p[pre + "mlp.down_proj.weight"] = linear(h, m["ffn"])
    p["model.norm.weight"] = norm_weight(h)
    if not m["tied"]:
        p["lm_head.weight"] = linear(VOCAB, h)
    return {k: v.clone().requires_grad_(True) for k, v in p.items()}


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_interleaved(x):
    """The other layout (GPT-J / Meta's original Llama code): pairs (2i, 2i+1). Only for the check."""
    pairs = x.view(*x.shape[:-1], -1, 2)
    return torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)


def scaled_inv_freq(inv_freq, rope_scaling):
    """transformers' _compute_llama3_parameters / linear scaling (modeling_rope_utils.py)."""
    if rope_scaling is None:
        return inv_freq
    factor = rope_scaling["factor"]
    if rope_scaling["rope_type"] == "linear":
        return inv_freq / factor
    assert rope_scaling["rope_type"] == "llama3"
    low, high = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]
    low_freq_wavelen = old_context_len / low
    high_freq_wavelen = old_context_len / high
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, inv_freq_llama)


def rope_tables(s, d, theta, interleaved=False, rope_scaling=None):
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    inv_freq = scaled_inv_freq(inv_freq, rope_scaling)
    freqs = torch.outer(torch.arange(s, dtype=torch.float64), inv_freq)  # [s, d/2]
    emb = torch.repeat_interleave(freqs, 2, dim=-1) if interleaved else torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()


def x_dtype(p):
    return p["model.norm.weight"].dtype


def forward(m, p, tokens, targets, interleaved=False, unscaled=False, no_window=False):
    """Mean token cross-entropy of the HF model on explicit targets."""
    b, s = tokens.shape
    h, hq, hkv = m["hidden"], m["heads"], m["kv"]
    d = h // hq
    scaling = None if unscaled else m.get("rope_scaling")
    cos, sin = (t.to(x_dtype(p)) for t in rope_tables(s, d, m["theta"], interleaved, scaling))
    rot = rotate_interleaved if interleaved else rotate_half
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    x = p["model.embed_tokens.weight"][tokens]  # [b, s, h]
    for i in range(m["layers"]):
        pre = f"model.layers.{i}."

        def proj(name, inp):
            bias = p.get(pre + f"self_attn.{name}.bias")
            return torch.nn.functional.linear(inp, p[pre + f"self_attn.{name}.weight"], bias)

        a = rms_norm(x, p[pre + "input_layernorm.weight"], m["eps"])
        q = proj("q_proj", a).view(b, s, hq, d).transpose(1, 2)  # [b, hq, s, d]
        k = proj("k_proj", a).view(b, s, hkv, d).transpose(1, 2)
        v = proj("v_proj", a).view(b, s, hkv, d).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        k = torch.repeat_interleave(k, hq // hkv, dim=1)  # repeat_kv
        v = torch.repeat_interleave(v, hq // hkv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        window = 0 if no_window else layer_window(m, i)
        mask = causal
        if window > 0:  # key j is seen by query i iff i - window < j <= i
            idx = torch.arange(s)
            mask = causal & (idx[None, :] > idx[:, None] - window)
        scores = scores.masked_fill(~mask, float("-inf"))
        o = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, hq * d)
        x = x + torch.nn.functional.linear(o, p[pre + "self_attn.o_proj.weight"])
        mm = rms_norm(x, p[pre + "post_attention_layernorm.weight"], m["eps"])
        gate = torch.nn.functional.linear(mm, p[pre + "mlp.gate_proj.weight"])
        up = torch.nn.functional.linear(mm, p[pre + "mlp.up_proj.weight"])
        x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, p[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], m["eps"])
    head = p["model.embed_tokens.weight"] if m["tied"] else p["lm_head.weight"]
    logits = x @ head.t()
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1).long())


def train(m, p, tokens, targets):
    """STEPS AdamW steps on p (in place, in p's dtype); returns each step's loss."""
    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = forward(m, p, tokens[step], targets[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def hf_config(m, dtype="float32"):
    c = {
        "architectures": [m["arch"]],
        "model_type": m["model_type"],
        "hidden_size": m["hidden"],
        "intermediate_size": m["ffn"],
        "num_hidden_layers": m["layers"],
        "num_attention_heads": m["heads"],
        "num_key_value_heads": m["kv"],
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "rms_norm_eps": m["eps"],
        "rope_theta": m["theta"],
        "rope_scaling": m.get("rope_scaling"),
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "tie_word_embeddings": m["tied"],
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "use_cache": True,
        "torch_dtype": dtype,
        "transformers_version": "4.44.0",
    }
    if m["model_type"] == "llama":
        c.update({"attention_bias": False, "mlp_bias": False, "head_dim": m["hidden"] // m["heads"],
                  "pretraining_tp": 1})
    elif m["model_type"] == "mistral":
        c.update({"sliding_window": m.get("window", 4096)})
    elif m.get("window"):
        c.update({"use_sliding_window": True, "sliding_window": m["window"],
                  "max_window_layers": m["max_window_layers"],
                  "layer_types": ["sliding_attention" if layer_window(m, i) else "full_attention"
                                  for i in range(m["layers"])]})
    else:
        c.update({"use_sliding_window": False, "sliding_window": 4096, "max_window_layers": 2})
    return c


def check_with_transformers(folder, m, p, tokens, targets):
    """transformers' own model on the folder gives our loss (skipped when transformers is missing)."""
    try:
        import transformers
    except ImportError:
        print("transformers not importable: the window fixtures are not checked against it")
        return
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, attn_implementation="eager",
                                                              torch_dtype=torch.float64)
    with torch.no_grad():
        logits = model(input_ids=tokens).logits
        theirs = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1).long()).item()
        ours = forward(m, p, tokens, targets).item()
    print(f"{m['arch']} window: transformers {transformers.__version__} loss {theirs:.9f}, ours {ours:.9f}")
    assert abs(theirs - ours) <= 1e-6 * abs(ours), "our reference must be transformers' model"


def write_config(folder, config):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
        f.write("\n")


def write_indexed_dataset(prefix, tokens):
    """Megatron's MMIDIDX format (include/parallel/indexed_dataset.hpp): one document, uint16."""
    with open(prefix + ".bin", "wb") as f:
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # uint16
        f.write(struct.pack("<Q", 1))  # sequences
        f.write(struct.pack("<Q", 2))  # document index entries
        f.write(struct.pack("<i", len(tokens)))
        f.write(struct.pack("<q", 0))
        f.write(struct.pack("<qq", 0, 1))
    print(f"wrote {os.path.relpath(prefix)}.{{bin,idx}} ({len(tokens)} tokens)")


def main():
    gen = torch.Generator().manual_seed(11)
    document = torch.randint(0, VOCAB, (STEPS * BATCH * SEQ + 1,), generator=gen)
    only = sys.argv[1:]
    if not only:
        write_indexed_dataset(os.path.join(OUT_DIR, "hf_tokens_text_document"), document.tolist())
    # Sample n = tokens [n*SEQ, n*SEQ + SEQ + 1); step t takes samples 2t, 2t+1.
    windows = torch.stack([document[n * SEQ:n * SEQ + SEQ + 1] for n in range(STEPS * BATCH)])
    windows = windows.view(STEPS, BATCH, SEQ + 1)
    tokens, targets = windows[:, :, :-1].contiguous(), windows[:, :, 1:].contiguous()

    for name, m in MODELS.items():
        if only and name not in only:
            continue
        p = init_params(m)
        initial = {k: v.detach().clone() for k, v in p.items()}
        folder = os.path.join(OUT_DIR, f"hf_{name}_tiny")
        write_config(folder, hf_config(m))
        write_safetensors(os.path.join(folder, "model.safetensors"), initial, {"format": "pt"})

        with torch.no_grad():
            half = forward(m, p, tokens[0], targets[0]).item()
            pairs = forward(m, p, tokens[0], targets[0], interleaved=True).item()
        print(f"{name}: loss {half:.6f} with half-split rotary, {pairs:.6f} with interleaved pairs")
        if m.get("window"):
            with torch.no_grad():
                full = forward(m, p, tokens[0], targets[0], no_window=True).item()
            print(f"{name}: loss {full:.6f} without the window")
            assert abs(half - full) > 1e-3 * abs(half), "the window must matter for this fixture"
            check_with_transformers(folder, m, p, tokens[0], targets[0])
        assert abs(half - pairs) > 1e-3 * abs(half), "the rotary layout must matter for this fixture"
        if m.get("rope_scaling"):
            with torch.no_grad():
                unscaled = forward(m, p, tokens[0], targets[0], unscaled=True).item()
            print(f"{name}: loss {unscaled:.6f} without rope_scaling")
            assert abs(half - unscaled) > 1e-3 * abs(half), "rope_scaling must matter for this fixture"

        losses = train(m, p, tokens, targets)
        for step, loss in enumerate(losses):
            print(f"{name} step {step}: loss {loss:.6f}")
        p32 = {k: v.detach().to(torch.float32).requires_grad_(True) for k, v in initial.items()}
        losses32 = train(m, p32, tokens, targets)
        loss_err = max(abs(a - b) / abs(a) for a, b in zip(losses, losses32))
        weight_err = max(((p[k] - p32[k].double()).abs().max() / p[k].abs().max()).item() for k in p)
        print(f"{name}: float32 PyTorch against float64: losses {loss_err:.2e}, weights {weight_err:.2e}")
        assert loss_err < 1e-6 and weight_err < 2e-5, "ill-conditioned fixture (see Conditioning)"
        after = {k: v.detach() for k, v in p.items()}
        after["tokens"] = tokens
        after["targets"] = targets
        after["losses"] = torch.tensor(losses)
        write_safetensors(os.path.join(OUT_DIR, f"hf_{name}_tiny_after3.safetensors"), after)

        if name == "llama":
            # bf16 and sharded: the layers go to the first file, the rest to the second.
            folder = os.path.join(OUT_DIR, "hf_llama_tiny_bf16")
            write_config(folder, hf_config(m, "bfloat16"))
            shards = [{}, {}]
            for k, v in initial.items():
                shards[0 if k.startswith("model.layers.") else 1][k] = v.to(torch.bfloat16)
            weight_map, total = {}, 0
            for i, shard in enumerate(shards):
                file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                write_safetensors(os.path.join(folder, file), shard, {"format": "pt"})
                for k, v in shard.items():
                    weight_map[k] = file
                    total += v.numel() * 2
            with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
                json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))},
                          f, indent=2)
                f.write("\n")


if __name__ == "__main__":
    main()
