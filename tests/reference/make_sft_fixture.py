#!/usr/bin/env python3
"""Writes the fine-tuning fixtures of tests/scripts/trainer_sft.sh (committed; CI has no Python).

Run with a Python that has torch: `/usr/bin/python3 tests/reference/make_sft_fixture.py`.

Everything here is an independent transcription of docs/data.md, "Fine-tuning data":
  1. The template. Each JSON line of sft_tiny.jsonl ({"prompt", "response"}) and sft_messages.jsonl
     ({"messages": [{role, content}]}) is rendered into tokens and a loss mask with a byte-level
     tokenizer (token = UTF-8 byte, eod = 256: what tokenizer.json below encodes to):
       prompt/response: prompt (mask 0), response (mask 1), eod (mask 1)
       messages: per message "<|ROLE|>\n" (mask 0), "CONTENT\n" (mask 1 for the assistant, else 0),
                 then eod (mask 1 when the last message is the assistant's, else 0)
     and written as the indexed datasets preprocess_data must write byte for byte:
     sft_{tiny,messages}_{text,loss_mask}_document.{bin,idx} (tokens uint16, masks uint8).
  2. The packing. Samples of >= 2 tokens, truncated to seq_length + 1 = 65 tokens, go first fit in
     document order into sequences of 33 tokens, padded with token 0. Sequence n of the run is
     packed sequence n mod E (no shuffling). Input = sequence[:64], target = sequence[1:]; each
     sample (and the padding) is its own document: positions restart at its start, a token attends
     to the earlier tokens of its own document only, and target j counts with its token's mask when
     it is in the same sample as input j (padding: 0).
  3. The model: a Llama-shaped model (as make_hf_llama.py: RMSNorm, half-split rotary, GQA,
     SwiGLU), 2 layers, hidden 16, 4 heads (d 4), 2 kv heads, ffn 32, vocab 257, theta 10000, eps
     1e-5, untied, written as an HF folder hf_sft_tiny/ (config.json, model.safetensors F32, and a
     byte-level BPE tokenizer.json with no merges: byte b is id b, <|endoftext|> is 256).
  4. Training: 3 steps of AdamW (lr 1e-2, betas (0.9, 0.95), eps 1e-8, weight decay 0.1 on the
     matrices, constant lr, no clipping), global batch 4 sequences, in float64. The loss of a step
     is the sum of the masked token losses of its 4 sequences divided by the number of masked-in
     tokens of all 4 (the global token mean). The script also computes the mean of the 4 per-sequence
     means (what averaging per micro-batch of one sequence would give) and requires it to differ by
     more than 0.1 % (1000 times the test tolerance), and trains in float32 PyTorch too, requiring it to stay within 1e-6 of float64.

Files (tests/reference/fixtures/): hf_sft_tiny/, sft_tiny_losses.json ({"losses": [3], "mean_of_means":
[3], "response_tokens": [[4] x 3]}), the four expected datasets above.
"""

import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402

torch.set_default_dtype(torch.float64)
HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "fixtures")

SEQ, BATCH, STEPS = 64, 4, 3
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1
VOCAB, EOD = 257, 256
M = dict(layers=2, hidden=16, heads=4, kv=2, ffn=32, theta=10000.0, eps=1e-5, seed=2027)


# ---- 1. the template ----------------------------------------------------------------------------

def encode(text):
    return list(text.encode("utf-8"))


def render(obj):
    tokens, mask = [], []

    def put(ids, m):
        tokens.extend(ids)
        mask.extend([m] * len(ids))

    if "messages" in obj:
        last = 0
        for message in obj["messages"]:
            last = 1 if message["role"] == "assistant" else 0
            put(encode("<|" + message["role"] + "|>\n"), 0)
            put(encode(message["content"] + "\n"), last)
    else:
        put(encode(obj["prompt"]), 0)
        put(encode(obj["response"]), 1)
        last = 1
    put([EOD], last)
    return tokens, mask


def read_jsonl(path):
    with open(path) as f:
        return [render(json.loads(line)) for line in f if line.strip()]


def write_indexed(prefix, documents, dtype_code, fmt):
    """Megatron's MMIDIDX format: one sequence per document."""
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            f.write(struct.pack(f"<{len(doc)}{fmt}", *doc))
    size = struct.calcsize(fmt)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", dtype_code))
        f.write(struct.pack("<Q", len(documents)))
        f.write(struct.pack("<Q", len(documents) + 1))
        for doc in documents:
            f.write(struct.pack("<i", len(doc)))
        pointer = 0
        for doc in documents:
            f.write(struct.pack("<q", pointer))
            pointer += len(doc) * size
        for d in range(len(documents) + 1):
            f.write(struct.pack("<q", d))


# ---- 2. the packing -----------------------------------------------------------------------------

def pack(samples, capacity):
    """First fit in document order; returns the bins, each a list of (tokens, mask)."""
    bins, free = [], []
    for tokens, mask in samples:
        if len(tokens) < 2:
            continue
        tokens, mask = tokens[:capacity], mask[:capacity]
        for b in range(len(bins)):
            if free[b] >= len(tokens):
                break
        else:
            bins.append([])
            free.append(capacity)
            b = len(bins) - 1
        bins[b].append((tokens, mask))
        free[b] -= len(tokens)
    return bins


def sequence(bin_, capacity):
    row, start, tmask = [], [], []
    for tokens, mask in bin_:
        at = len(row)
        row += tokens
        start += [at] * len(tokens)
        tmask += mask
    at = len(row)
    pad = capacity - at
    row += [0] * pad
    start += [at] * pad
    tmask += [0] * pad
    s = capacity - 1
    tokens = row[:s]
    targets = row[1:]
    positions = [j - start[j] for j in range(s)]
    doc_start = start[:s]
    loss_mask = [tmask[j + 1] if start[j + 1] == start[j] else 0 for j in range(s)]
    return tokens, targets, positions, doc_start, loss_mask


# ---- 3. the model -------------------------------------------------------------------------------

def f32(t):
    return t.to(torch.float32).to(torch.float64)


def init_params():
    torch.manual_seed(M["seed"])
    h, hq, hkv, ffn = M["hidden"], M["heads"], M["kv"], M["ffn"]
    d = h // hq

    def linear(out_f, in_f):
        return f32(torch.randn(out_f, in_f) / math.sqrt(in_f))

    def norm_weight(n):
        return f32(1 + 0.1 * torch.randn(n))

    p = {"model.embed_tokens.weight": f32(torch.randn(VOCAB, h))}
    for i in range(M["layers"]):
        pre = f"model.layers.{i}."
        p[pre + "input_layernorm.weight"] = norm_weight(h)
        p[pre + "self_attn.q_proj.weight"] = linear(hq * d, h)
        p[pre + "self_attn.k_proj.weight"] = linear(hkv * d, h)
        p[pre + "self_attn.v_proj.weight"] = linear(hkv * d, h)
        p[pre + "self_attn.o_proj.weight"] = linear(h, hq * d)
        p[pre + "post_attention_layernorm.weight"] = norm_weight(h)
        p[pre + "mlp.gate_proj.weight"] = linear(ffn, h)
        p[pre + "mlp.up_proj.weight"] = linear(ffn, h)
        p[pre + "mlp.down_proj.weight"] = linear(h, ffn)
    p["model.norm.weight"] = norm_weight(h)
    p["lm_head.weight"] = linear(VOCAB, h)
    return p


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def loss_sum(p, tokens, targets, positions, doc_start, loss_mask):
    """Sum over the batch of mask * token cross-entropy, with per-token positions and document masks."""
    b, s = tokens.shape
    h, hq, hkv = M["hidden"], M["heads"], M["kv"]
    d = h // hq
    dt = p["model.norm.weight"].dtype
    inv_freq = 1.0 / (M["theta"] ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = positions.to(torch.float64)[..., None] * inv_freq  # [b, s, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().to(dt)[:, None], emb.sin().to(dt)[:, None]  # [b, 1, s, d]
    i_idx = torch.arange(s)
    # query i sees key j iff doc_start[i] <= j <= i
    allowed = (i_idx[None, None, :] <= i_idx[None, :, None]) & (i_idx[None, None, :] >= doc_start[:, :, None])
    x = p["model.embed_tokens.weight"][tokens]
    for i in range(M["layers"]):
        pre = f"model.layers.{i}."
        a = rms_norm(x, p[pre + "input_layernorm.weight"], M["eps"])
        q = torch.nn.functional.linear(a, p[pre + "self_attn.q_proj.weight"]).view(b, s, hq, d).transpose(1, 2)
        k = torch.nn.functional.linear(a, p[pre + "self_attn.k_proj.weight"]).view(b, s, hkv, d).transpose(1, 2)
        v = torch.nn.functional.linear(a, p[pre + "self_attn.v_proj.weight"]).view(b, s, hkv, d).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k = torch.repeat_interleave(k, hq // hkv, dim=1)
        v = torch.repeat_interleave(v, hq // hkv, dim=1)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(d)
        scores = scores.masked_fill(~allowed[:, None], float("-inf"))
        o = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(b, s, hq * d)
        x = x + torch.nn.functional.linear(o, p[pre + "self_attn.o_proj.weight"])
        mm = rms_norm(x, p[pre + "post_attention_layernorm.weight"], M["eps"])
        gate = torch.nn.functional.linear(mm, p[pre + "mlp.gate_proj.weight"])
        up = torch.nn.functional.linear(mm, p[pre + "mlp.up_proj.weight"])
        x = x + torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, p[pre + "mlp.down_proj.weight"])
    x = rms_norm(x, p["model.norm.weight"], M["eps"])
    logits = x @ p["lm_head.weight"].t()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), reduction="none")
    return (ce.view(b, s) * loss_mask.to(dt)).sum(-1)  # [b]


# ---- 4. training --------------------------------------------------------------------------------

def train(p, batches):
    decay = [v for v in p.values() if v.dim() >= 2]
    no_decay = [v for v in p.values() if v.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    losses, mean_of_means = [], []
    for tokens, targets, positions, doc_start, loss_mask in batches:
        opt.zero_grad()
        sums = loss_sum(p, tokens, targets, positions, doc_start, loss_mask)
        counts = loss_mask.sum(-1).to(sums.dtype)
        loss = sums.sum() / counts.sum()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        mean_of_means.append((sums.detach() / counts).mean().item())
    return losses, mean_of_means


def hf_config():
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": M["hidden"],
        "intermediate_size": M["ffn"], "num_hidden_layers": M["layers"], "num_attention_heads": M["heads"],
        "num_key_value_heads": M["kv"], "vocab_size": VOCAB, "max_position_embeddings": 256,
        "rms_norm_eps": M["eps"], "rope_theta": M["theta"], "rope_scaling": None, "hidden_act": "silu",
        "initializer_range": 0.02, "tie_word_embeddings": False, "attention_dropout": 0.0,
        "bos_token_id": EOD, "eos_token_id": EOD, "use_cache": True, "torch_dtype": "float32",
        "transformers_version": "4.44.0", "attention_bias": False, "mlp_bias": False,
        "head_dim": M["hidden"] // M["heads"],
    }


def bytes_to_unicode():
    """GPT-2's byte-level alphabet (the tokenizers library's ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, (chr(c) for c in cs)))


def tokenizer_json():
    b2u = bytes_to_unicode()
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": EOD, "content": "<|endoftext|>", "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {b2u[b]: b for b in range(256)}, "merges": []},
    }


def main():
    folder = os.path.join(OUT_DIR, "hf_sft_tiny")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(hf_config(), f, indent=2)
        f.write("\n")
    with open(os.path.join(folder, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(), f, ensure_ascii=False)
        f.write("\n")

    for name in ("sft_tiny", "sft_messages"):
        samples = read_jsonl(os.path.join(OUT_DIR, name + ".jsonl"))
        write_indexed(os.path.join(OUT_DIR, name + "_text_document"), [t for t, _ in samples], 8, "H")
        write_indexed(os.path.join(OUT_DIR, name + "_loss_mask_document"), [m for _, m in samples], 1, "B")
        print(f"{name}: {len(samples)} samples, {sum(len(t) for t, _ in samples)} tokens")

    samples = read_jsonl(os.path.join(OUT_DIR, "sft_tiny.jsonl"))
    bins = pack(samples, SEQ + 1)
    truncated = sum(1 for t, _ in samples if len(t) > SEQ + 1)
    print(f"packed {len(samples)} samples into {len(bins)} sequences of {SEQ + 1} tokens; {truncated} truncated")
    assert truncated >= 1, "the fixture should truncate a sample"
    rows = [sequence(bins[n % len(bins)], SEQ + 1) for n in range(STEPS * BATCH)]
    batches = []
    for t in range(STEPS):
        part = rows[t * BATCH:(t + 1) * BATCH]
        batches.append(tuple(torch.tensor([r[k] for r in part]) for k in range(5)))
    response_tokens = [[int(x) for x in b[4].sum(-1)] for b in batches]
    print("masked-in tokens per sequence and step:", response_tokens)

    p = {k: v.clone().requires_grad_(True) for k, v in init_params().items()}
    initial = {k: v.detach().clone() for k, v in p.items()}
    write_safetensors(os.path.join(folder, "model.safetensors"), initial, {"format": "pt"})
    losses, mean_of_means = train(p, batches)
    for t in range(STEPS):
        print(f"step {t}: global token mean {losses[t]:.9f}, mean of micro-batch means {mean_of_means[t]:.9f}")
        assert abs(losses[t] - mean_of_means[t]) > 1e-3 * abs(losses[t]), "mean of means must differ"
    p32 = {k: v.to(torch.float32).requires_grad_(True) for k, v in initial.items()}
    losses32, _ = train(p32, batches)
    err = max(abs(a - b) / abs(a) for a, b in zip(losses, losses32))
    print(f"float32 PyTorch against float64: losses {err:.2e}")
    assert err < 1e-6, "ill-conditioned fixture"
    with open(os.path.join(OUT_DIR, "sft_tiny_losses.json"), "w") as f:
        json.dump({"losses": losses, "mean_of_means": mean_of_means, "response_tokens": response_tokens}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
