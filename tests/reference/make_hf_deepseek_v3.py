#!/usr/bin/env python3
"""Writes the DeepSeek-V3 fixtures of tests/scripts/hf_llama.sh (committed; CI has no Python).

A tiny DeepseekV3ForCausalLM built, saved and trained by transformers itself (its own model, eager
attention, the plain per-expert loop), so that the reference is transformers' code:

  hf_deepseek_v3_tiny/   DeepseekV3ForCausalLM: hidden 24, 4 layers (layer 0 dense, first_k_dense_replace
                   1; layers 1-3 MoE), vocab 48, untied. Multi-head latent attention: 4 heads,
                   q_lora_rank 12, kv_lora_rank 12, qk_nope_head_dim 8, qk_rope_head_dim 4,
                   v_head_dim 6, rope_interleave true, yarn rope (factor 4, original 16, mscale 1.0,
                   mscale_all_dim 0.8: both the rotary attention factor and the softmax scale move).
                   Experts: 8 routed (moe_intermediate_size 8) in n_group 4, topk_group 2, top-2,
                   sigmoid scores, norm_topk_prob, routed_scaling_factor 2.5, one shared expert; the
                   dense layer's intermediate_size 32. e_score_correction_bias drawn (not zero), so
                   that it chooses experts in the fixture.
  hf_deepseek_v3_tiny_after3.safetensors   every tensor after 3 AdamW steps under its HF name
                   (the expert bias included), losses [3], tokens / targets [3, 2, 8]
  hf_deepseek_v3_t4/config.json   the same model as transformers 4.57 writes it (rope_theta,
                   rope_scaling; 4.57 writes dtype, older 4.x torch_dtype): config only, the weights
                   are hf_deepseek_v3_tiny's
  hf_deepseek_v3_mtp_tiny/   the same model as DeepSeek's own checkpoints lay out their multi-token
                   prediction layer: sharded, model-00002-of-00002.safetensors holds
                   model.layers.4.* (enorm, hnorm, eh_proj, shared_head, embed_tokens, a decoder
                   layer like layer 3, experts included; embed_tokens and shared_head.head copies of
                   the model's) and the index lists them; model-00001-of-00002.safetensors is
                   hf_deepseek_v3_tiny's model.safetensors (the test copies it in)

The aux-loss-free balancing bias: transformers never updates e_score_correction_bias; this reference
updates it after each step exactly as libparallel's trainer does (model.moe_bias_update_speed 0.001,
GPTModel::update_router_bias): for each MoE layer, the tokens the step routed to each expert (top-k
choices over the whole batch), and b_e += 0.001 * sign(mean load - load_e), computed in float64 and
rounded once to float32. So the imported run trains with the default speed, and the fixture checks
that the bias is imported, updated and exported.

Weights are drawn as make_hf_qwen3.py draws them (normal(0, 1/sqrt(fan_in)), norms 1 + normal(0, 0.1),
the embedding normal(0, 1)), the bias normal(0, 0.05), rounded to float32. Training is make_hf_qwen3.py's:
seq 8, batch 2, 3 steps of torch.optim.AdamW (lr 1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on
matrices only) in float64, checked against float32 training (losses 1e-6; weights by hf_compare's
rule: 1e-5 of each tensor's largest but for one element or 1 %, all within 3e-4). transformers keeps the router (gate.weight, e_score_correction_bias) in float32
even in a float64 model (_keep_in_fp32_modules_strict), and its RMSNorm computes in float32: that
rounding is part of the reference. The script also checks that the settings matter: the loss moves
by > 1e-4 when rope_interleave is read as false, or the expert bias is zeroed.

Run with transformers 5 and PyTorch 2 in side folders, then transformers 4.57 for the 4.x config:
  PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/make_hf_deepseek_v3.py
  PYTHONPATH=/tmp/hf4:/tmp/torch2 python3 tests/reference/make_hf_deepseek_v3.py
"""

import json
import math
import os
import shutil
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, DeepseekV3Config, DeepseekV3ForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402
from make_hf_transformers5 import BATCH, BETAS, EPS, LR, SEQ, STEPS, VOCAB, WEIGHT_DECAY, batches  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
SEED = 1721
BIAS_SPEED = 0.001  # model.moe_bias_update_speed's default
ROPE = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}
KWARGS = dict(vocab_size=VOCAB, hidden_size=24, intermediate_size=32, moe_intermediate_size=8, num_hidden_layers=4,
              num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8,
              routed_scaling_factor=2.5, kv_lora_rank=12, q_lora_rank=12, qk_rope_head_dim=4, v_head_dim=6,
              qk_nope_head_dim=8, n_group=4, topk_group=2, num_experts_per_tok=2, first_k_dense_replace=1,
              norm_topk_prob=True, hidden_act="silu", max_position_embeddings=64, initializer_range=0.02,
              rms_norm_eps=1e-6, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False, rope_interleave=True,
              attention_bias=False, attention_dropout=0.0)
V5 = transformers.__version__.split(".")[0] == "5"


def make_config(**overrides):
    kwargs = dict(KWARGS, **overrides)
    if V5:
        kwargs["rope_parameters"] = dict(ROPE)
        kwargs["num_mtp_layers"] = 0  # transformers' model has no MTP layer; the folder holds none
    else:
        kwargs["rope_theta"] = ROPE["rope_theta"]
        kwargs["rope_scaling"] = {k: v for k, v in ROPE.items() if k != "rope_theta"}
    config = DeepseekV3Config(**kwargs)
    config.architectures = ["DeepseekV3ForCausalLM"]
    return config


def init_weights(model, seed):
    torch.manual_seed(seed)
    state = {}
    for name, p in sorted(model.named_parameters()):
        if name.endswith("norm.weight"):
            t = 1.0 + 0.1 * torch.randn(p.shape)
        elif name == "model.embed_tokens.weight":
            t = torch.randn(p.shape)
        else:  # linears [out, in]; experts fused as transformers 5 holds them, [E, out, in]
            assert p.dim() in (2, 3), name
            t = torch.randn(p.shape) / math.sqrt(p.shape[-1])
        state[name] = t.to(torch.float32)
    for name, b in sorted(model.named_buffers()):
        if name.endswith("e_score_correction_bias"):
            state[name] = (0.05 * torch.randn(b.shape)).to(torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and all("rotary_emb" in k for k in missing), (missing, unexpected)


def hf_names(model):
    """The tensors under the names save_pretrained writes: transformers 5 holds a MoE layer's experts
    fused (experts.gate_up_proj [E, 2f, h], experts.down_proj [E, h, f]) and saves one tensor per
    expert (experts.E.{gate,up,down}_proj.weight); the expert bias is a saved buffer."""
    out = {}
    for name, p in model.named_parameters():
        p = p.detach()
        if ".mlp.experts." not in name:
            out[name] = p
            continue
        block = name[:name.index(".experts.")]
        for e in range(p.shape[0]):
            if name.endswith("gate_up_proj"):
                gate, up = p[e].chunk(2, dim=0)
                out[f"{block}.experts.{e}.gate_proj.weight"] = gate
                out[f"{block}.experts.{e}.up_proj.weight"] = up
            else:
                out[f"{block}.experts.{e}.down_proj.weight"] = p[e]
    for name, b in model.named_buffers():
        if name.endswith("e_score_correction_bias"):
            out[name] = b.detach()
    return out


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def routers(model):
    return [layer.mlp.gate for layer in model.model.layers if hasattr(layer.mlp, "gate")]


def train(model, tokens, targets):
    """AdamW as make_hf_qwen3.py, plus libparallel's expert-bias update after each step."""
    params = dict(model.named_parameters())
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    loads = {}

    def count(router, _inputs, outputs):
        _, _, indices = outputs
        loads[router] = loads.get(router, 0) + torch.bincount(indices.reshape(-1), minlength=router.num_experts)

    hooks = [r.register_forward_hook(count) for r in routers(model)]
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loads.clear()
        loss = loss_of(model, tokens[step], targets[step])
        loss.backward()
        opt.step()
        with torch.no_grad():
            for router in routers(model):
                load = loads[router].to(torch.int64)
                sign = torch.sign(load.sum() - router.num_experts * load).to(torch.float64)
                b = router.e_score_correction_bias
                b.copy_((b.to(torch.float64) + BIAS_SPEED * sign).to(b.dtype))
        losses.append(loss.item())
    for h in hooks:
        h.remove()
    return losses


def load(folder, dtype, **overrides):
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager",
                                                 experts_implementation="eager", **overrides)
    model.train()  # dropout is 0
    return model


def write_mtp(folder, base):
    """DeepSeek's checkpoints carry the multi-token prediction layer as model.layers.{num_hidden_layers}.*
    (enorm, hnorm, eh_proj, shared_head.{norm, head}, embed_tokens and a decoder layer of the last
    layer's make-up, routed experts included): a shard of its own here, listed by the index with the
    base model's shard. embed_tokens and shared_head.head are copies of the model's embedding and
    lm_head, as in DeepSeek's checkpoints (the MTP module shares them); the norms are drawn, so that
    swapping enorm and hnorm would show."""
    torch.manual_seed(SEED + 1)
    n = KWARGS["num_hidden_layers"]
    h = KWARGS["hidden_size"]
    mtp = {}
    for name, t in base.items():
        if name.startswith(f"model.layers.{n - 1}."):
            mtp[name.replace(f"model.layers.{n - 1}.", f"model.layers.{n}.")] = torch.randn(t.shape) * 0.1
    prefix = f"model.layers.{n}."
    mtp[prefix + "enorm.weight"] = 1.0 + 0.1 * torch.randn(h)
    mtp[prefix + "hnorm.weight"] = 1.0 + 0.1 * torch.randn(h)
    mtp[prefix + "eh_proj.weight"] = torch.randn(h, 2 * h) * 0.1
    mtp[prefix + "shared_head.norm.weight"] = 1.0 + 0.1 * torch.randn(h)
    mtp[prefix + "shared_head.head.weight"] = base["lm_head.weight"].clone()
    mtp[prefix + "embed_tokens.weight"] = base["model.embed_tokens.weight"].clone()
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    from safetensors.torch import save_file
    save_file({k: v.to(torch.float32).contiguous() for k, v in mtp.items()},
              os.path.join(folder, "model-00002-of-00002.safetensors"), metadata={"format": "pt"})
    weight_map = {k: "model-00001-of-00002.safetensors" for k in base}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in mtp})
    total = sum(t.numel() * 4 for t in base.values()) + sum(t.numel() * 4 for t in mtp.values())
    with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}, f, indent=2)
    config = make_config()
    config.num_mtp_layers = 1
    config.save_pretrained(folder)
    print(f"wrote {os.path.relpath(folder)} ({len(mtp)} MTP tensors)")


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    if not V5:
        folder = os.path.join(OUT_DIR, "hf_deepseek_v3_t4")
        shutil.rmtree(folder, ignore_errors=True)
        config = make_config()
        config.torch_dtype = torch.float32  # as a model's save_pretrained writes it
        config.save_pretrained(folder)
        with open(os.path.join(folder, "config.json")) as f:
            written = json.load(f)
        assert "rope_scaling" in written and "rope_theta" in written and "rope_parameters" not in written, written
        print(f"wrote {os.path.relpath(folder)}/config.json (transformers 4.x's layout)")
        return
    tokens, targets = batches()
    folder = os.path.join(OUT_DIR, "hf_deepseek_v3_tiny")
    shutil.rmtree(folder, ignore_errors=True)
    config = make_config()
    model = DeepseekV3ForCausalLM(config).to(torch.float32)
    init_weights(model, SEED)
    model.save_pretrained(folder)
    for extra in os.listdir(folder):
        if extra not in ("config.json", "model.safetensors"):
            os.remove(os.path.join(folder, extra))
    with open(os.path.join(folder, "config.json")) as f:
        written = json.load(f)
    assert "rope_parameters" in written and "dtype" in written, written
    from safetensors import safe_open
    from safetensors.torch import load_file
    with safe_open(os.path.join(folder, "model.safetensors"), "pt") as f:
        saved = set(f.keys())
    assert saved == set(hf_names(model)), sorted(saved ^ set(hf_names(model)))
    print(f"wrote {os.path.relpath(folder)}")
    write_mtp(os.path.join(OUT_DIR, "hf_deepseek_v3_mtp_tiny"), load_file(os.path.join(folder, "model.safetensors")))

    model = load(folder, torch.float64)
    with torch.no_grad():
        first = loss_of(model, tokens[0], targets[0]).item()
        flat = load(folder, torch.float64, rope_interleave=False)
        flat_loss = loss_of(flat, tokens[0], targets[0]).item()
        unbiased = load(folder, torch.float64)
        for r in routers(unbiased):
            r.e_score_correction_bias.zero_()
        unbiased_loss = loss_of(unbiased, tokens[0], targets[0]).item()
    print(f"first loss {first:.8f}; rope_interleave false: {flat_loss:.8f}; expert bias zero: {unbiased_loss:.8f}")
    assert abs(flat_loss - first) > 1e-4 * first, "rope_interleave must matter for this fixture"
    assert abs(unbiased_loss - first) > 1e-4 * first, "the expert bias must matter for this fixture"
    losses = train(model, tokens, targets)
    model32 = load(folder, torch.float32)
    losses32 = train(model32, tokens, targets)
    after, after32 = hf_names(model), hf_names(model32)
    for step in range(STEPS):
        rel = abs(losses32[step] - losses[step]) / losses[step]
        print(f"step {step}: float64 {losses[step]:.8f}, float32 {losses32[step]:.8f} (relative {rel:.1e})")
        assert rel < 1e-6, "float32 training must stay close to float64 (conditioning)"
    # hf_compare's weight rule: within 1e-5 of each tensor's largest but for 1 % of its elements (one
    # always), every element within 3e-4 (Adam moves an element whose gradient is ~0 on rounding noise).
    worst, beyond = 0.0, []
    for k in after:
        d = (after32[k].double() - after[k].double()).abs() / after[k].double().abs().max()
        worst = max(worst, d.max().item())
        n = int((d > 1e-5).sum())
        if n:
            beyond.append(f"{k} ({n} of {d.numel()}, {d.max().item():.1e})")
        assert d.max() < 3e-4 and n <= max(1, d.numel() // 100), f"{k}: float32 training strays from float64"
    print(f"float32 weights after 3 steps: worst {worst:.1e} of the tensor's max; beyond 1e-5: {beyond}")
    moved = max((after[k].double() - v.double()).abs().max().item()
                for k, v in load_file(os.path.join(folder, "model.safetensors")).items()
                if k.endswith("e_score_correction_bias"))
    print(f"expert bias moved by up to {moved:.4f}")
    assert moved > 0.5 * BIAS_SPEED, "the expert bias must be updated"
    after["tokens"] = tokens
    after["targets"] = targets
    after["losses"] = torch.tensor(losses)
    write_safetensors(os.path.join(OUT_DIR, "hf_deepseek_v3_tiny_after3.safetensors"), after)


if __name__ == "__main__":
    main()
