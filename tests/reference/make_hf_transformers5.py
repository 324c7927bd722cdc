#!/usr/bin/env python3
"""Writes the transformers-5 fixtures of tests/scripts/hf_llama.sh (committed; CI has no Python).

transformers 5 writes config.json differently from 4.x: no top-level rope_theta / rope_scaling but
"rope_parameters": {"rope_theta": ..., "rope_type": ..., <scaling keys>}, and "dtype" instead of
"torch_dtype". An importer that knew only the 4.x keys read such a Llama with rope_theta 10000 and
trained a different model without a word. These fixtures are saved by transformers itself:

  hf_llama_t5/    LlamaForCausalLM, rope_parameters {"rope_type": "default", "rope_theta": 500000}
  hf_llama3_t5/   LlamaForCausalLM, rope_parameters {"rope_type": "llama3", rope_theta 10000, factor 8, ...}
  hf_mistral_t5/  MistralForCausalLM (sliding_window 4096, rope_theta 1e6): config.json only
  hf_qwen2_t5/    Qwen2ForCausalLM (layer_types, rope_theta 1000): config.json only
  hf_{llama,llama3}_t5_after3.safetensors   the weights after 3 AdamW steps, losses [3], tokens and
                  targets [3, 2, 8], all computed by transformers' own LlamaForCausalLM (float64)

The weights are those of make_hf_llama.py's hf_llama_tiny and hf_llama3_tiny (chosen there to be well
conditioned and so that the rotary layout and the scaling matter), loaded into transformers' model
and saved by save_pretrained; the Mistral and Qwen2 configs go with hf_mistral_tiny's and
hf_qwen2_tiny's weights. Training is make_hf_llama.py's: seq 8, batch 2, 3 steps of
torch.optim.AdamW (lr 1e-2, betas 0.9/0.95, eps 1e-8, weight decay 0.1 on matrices only), the mean
cross-entropy of the logits against the next tokens of hf_tokens_text_document. The script checks
that transformers' float64 losses equal make_hf_llama.py's own float64 reference (the same model
written out by hand) and that rope_theta 10000 would give a different loss.

Run with transformers 5 and PyTorch 2 in side folders (nothing installed system-wide):
  bash ../shared/tools/torch2_setup.sh                        # torch in /tmp/torch2
  python3 -m pip install --target /tmp/hf5 transformers       # transformers 5.x in /tmp/hf5
  PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/make_hf_transformers5.py
"""

import json
import os
import shutil
import sys

import torch
import transformers
from safetensors.torch import load_file
from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, Qwen2Config

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
BATCH, SEQ, STEPS = 2, 8, 3
LR, BETAS, EPS, WEIGHT_DECAY = 1e-2, (0.9, 0.95), 1e-8, 0.1
VOCAB = 48

COMMON = dict(vocab_size=VOCAB, num_hidden_layers=2, num_key_value_heads=2, max_position_embeddings=64,
              hidden_act="silu", initializer_range=0.02, attention_dropout=0.0, bos_token_id=1, eos_token_id=2)
MODELS = {
    "llama": (LlamaConfig, "hf_llama_tiny",
              dict(COMMON, hidden_size=24, intermediate_size=32, num_attention_heads=4, rms_norm_eps=1e-5,
                   tie_word_embeddings=False,
                   rope_parameters={"rope_type": "default", "rope_theta": 500000.0})),
    "llama3": (LlamaConfig, "hf_llama3_tiny",
               dict(COMMON, hidden_size=32, intermediate_size=40, num_attention_heads=4, rms_norm_eps=1e-5,
                    tie_word_embeddings=False,
                    rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                     "low_freq_factor": 1.0, "high_freq_factor": 32.0,
                                     "original_max_position_embeddings": 256})),
    "mistral": (MistralConfig, "hf_mistral_tiny",
                dict(COMMON, hidden_size=24, intermediate_size=40, num_attention_heads=6, rms_norm_eps=1e-6,
                     tie_word_embeddings=False, sliding_window=4096,
                     rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "qwen2": (Qwen2Config, "hf_qwen2_tiny",
              dict(COMMON, hidden_size=24, intermediate_size=32, num_attention_heads=4, rms_norm_eps=1e-6,
                   tie_word_embeddings=True, use_sliding_window=False, max_window_layers=2,
                   rope_parameters={"rope_type": "default", "rope_theta": 1000.0})),
}
TRAINED = ("llama", "llama3")  # the Mistral and Qwen2 configs only check the key table


def read_document():
    with open(os.path.join(OUT_DIR, "hf_tokens_text_document.bin"), "rb") as f:
        data = f.read()
    return torch.tensor(list(memoryview(data).cast("H")), dtype=torch.long)


def batches():
    document = read_document()
    windows = torch.stack([document[n * SEQ:n * SEQ + SEQ + 1] for n in range(STEPS * BATCH)])
    windows = windows.view(STEPS, BATCH, SEQ + 1)
    return windows[:, :, :-1].contiguous(), windows[:, :, 1:].contiguous()


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def train(model, tokens, targets):
    params = dict(model.named_parameters())
    decay = [p for p in params.values() if p.dim() >= 2]
    no_decay = [p for p in params.values() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": WEIGHT_DECAY},
                             {"params": no_decay, "weight_decay": 0.0}], lr=LR, betas=BETAS, eps=EPS)
    losses = []
    for step in range(STEPS):
        opt.zero_grad()
        loss = loss_of(model, tokens[step], targets[step])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def load_model(cls_config, folder, dtype):
    model = LlamaForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    model.train()  # dropout is 0: train() only makes the check honest
    return model


def main():
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    assert transformers.__version__.split(".")[0] == "5", "these fixtures are transformers 5's layout"
    tokens, targets = batches()
    for name, (config_class, source, kwargs) in MODELS.items():
        folder = os.path.join(OUT_DIR, f"hf_{name}_t5")
        shutil.rmtree(folder, ignore_errors=True)
        config = config_class(**kwargs)
        config.architectures = [config_class.__name__.replace("Config", "ForCausalLM")]
        if name not in TRAINED:
            config.save_pretrained(folder)
            print(f"wrote {os.path.relpath(folder)}/config.json")
            continue
        weights = load_file(os.path.join(OUT_DIR, source, "model.safetensors"))
        model = LlamaForCausalLM(config).to(torch.float32)
        missing, unexpected = model.load_state_dict(weights, strict=False)
        assert not missing and not unexpected, (missing, unexpected)
        model.save_pretrained(folder)
        for extra in os.listdir(folder):
            if extra not in ("config.json", "model.safetensors"):
                os.remove(os.path.join(folder, extra))
        with open(os.path.join(folder, "config.json")) as f:
            written = json.load(f)
        assert "rope_parameters" in written and "rope_theta" not in written and "dtype" in written, written
        print(f"wrote {os.path.relpath(folder)} (config.json as transformers {transformers.__version__} writes it)")

        # transformers' own model, reloaded from the folder it wrote, trains in float64.
        model = load_model(config_class, folder, torch.float64)
        with torch.no_grad():
            first = loss_of(model, tokens[0], targets[0]).item()
            wrong = LlamaForCausalLM(LlamaConfig(**dict(kwargs, rope_parameters={"rope_type": "default",
                                                                                 "rope_theta": 10000.0})))
            wrong.load_state_dict(model.state_dict())
            wrong_loss = loss_of(wrong.to(torch.float64), tokens[0], targets[0]).item()
        print(f"{name}: first loss {first:.8f}; read with rope_theta 10000 and no scaling: {wrong_loss:.8f} "
              f"(relative {abs(wrong_loss - first) / first:.1e})")
        assert abs(wrong_loss - first) > 1e-4 * first, "the rope parameters must matter for this fixture"
        losses = train(model, tokens, targets)
        model32 = load_model(config_class, folder, torch.float32)
        losses32 = train(model32, tokens, targets)
        reference = load_file(os.path.join(OUT_DIR, f"hf_{source[3:]}_after3.safetensors"))
        for step in range(STEPS):
            ref = reference["losses"][step].item()
            print(f"{name} step {step}: transformers float64 {losses[step]:.8f}, float32 {losses32[step]:.8f}, "
                  f"make_hf_llama.py's reference {ref:.8f} (relative {abs(losses[step] - ref) / ref:.1e})")
            assert abs(losses[step] - ref) < 1e-6 * ref, "transformers and make_hf_llama.py disagree"
        after = {k: v.detach() for k, v in model.named_parameters()}
        worst = max(((after[k] - reference[k].double()).abs().max() / reference[k].abs().max()).item()
                    for k in after)
        print(f"{name}: weights after 3 steps against make_hf_llama.py's: worst {worst:.1e} of the tensor's max")
        after["tokens"] = tokens
        after["targets"] = targets
        after["losses"] = torch.tensor(losses)
        write_safetensors(os.path.join(OUT_DIR, f"hf_{name}_t5_after3.safetensors"), after)


if __name__ == "__main__":
    main()
