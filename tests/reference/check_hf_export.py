#!/usr/bin/env python3
"""Loads convert_checkpoint's Hugging Face exports in transformers and checks them (run by hand when
the fixtures or the export change; the results are recorded in docs/huggingface.md, "Tested"):

  for each fixture folder: convert_checkpoint --from hf FOLDER -> --to hf EXPORT, then
  - AutoModelForCausalLM.from_pretrained(EXPORT, output_loading_info=True): no missing, unexpected
    or mismatched keys, and the architecture class of the original folder (Mistral stays Mistral);
  - the export's config as transformers reads it has the original's rope parameters (theta, scaling),
    for Mistral and Mixtral its sliding_window, for Qwen3-MoE, Mixtral and DeepSeek-V3 its experts and
    routing (expert count and width, top k, norm_topk_prob, jitter noise; DeepSeek-V3's groups,
    scaling, shared experts, dense first layers, latent attention sizes and rope_interleave);
  - the export's logits equal the original folder's (float32, on 2 x 8 tokens of the fixture document).

  PYTHONPATH=/tmp/hf5:/tmp/torch2 python3 tests/reference/check_hf_export.py build/bin   # transformers 5
  PYTHONPATH=/tmp/hf4:/tmp/torch2 python3 tests/reference/check_hf_export.py build/bin   # transformers 4.x
Exits 1 when a check fails.
"""

import json
import os
import subprocess
import sys
import tempfile

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
# folder -> the folder holding its weights (the transformers-5 Mistral and Qwen2 are configs only)
FOLDERS = {"hf_llama_tiny": None, "hf_mistral_tiny": None, "hf_qwen2_tiny": None, "hf_llama3_tiny": None,
           "hf_llama_t5": None, "hf_llama3_t5": None, "hf_mistral_t5": "hf_mistral_tiny",
           "hf_qwen2_t5": "hf_qwen2_tiny", "hf_qwen3_tiny": None, "hf_qwen3_moe_tiny": None,
            "hf_qwen2_yarn_t5": None, "hf_qwen3_moe_norm_tiny": None, "hf_mixtral_tiny": None,
           "hf_deepseek_v3_tiny": None, "hf_deepseek_v3_mtp_tiny": None}
# DeepSeek-style folders with multi-token prediction layers: folder -> the folder whose model.safetensors
# is their first shard. transformers' DeepseekV3 has no MTP layer: it reports the MTP tensors
# (model.layers.{num_hidden_layers}.*) as unexpected keys (its _keys_to_ignore_on_load_unexpected names
# only the full model's layer 61); those are expected and counted, any other key is a problem.
MTP_FOLDERS = {"hf_deepseek_v3_mtp_tiny": "hf_deepseek_v3_tiny"}
# The experts and their routing, as transformers reads them from the export and from the source.
MOE_KEYS = ("num_local_experts", "num_experts_per_tok", "norm_topk_prob", "moe_intermediate_size",
            "intermediate_size", "router_jitter_noise", "output_router_logits",
            # DeepSeek-V3: latent attention and its routing
            "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave",
            "n_routed_experts", "n_shared_experts", "n_group", "topk_group", "routed_scaling_factor",
            "first_k_dense_replace")
# transformers 4.x cannot read the folders transformers 5 wrote (it takes rope_theta 10000 for a
# missing top-level rope_theta: the bug this checks we do not have). Under 4.x the export of a
# transformers-5 folder is compared with the 4.x-layout fixture of the same weights and model.
SAME_MODEL_4X = {"hf_llama_t5": "hf_llama_tiny", "hf_llama3_t5": "hf_llama3_tiny", "hf_mistral_t5": "hf_mistral_tiny",
                 "hf_qwen2_t5": "hf_qwen2_tiny", "hf_qwen2_yarn_t5": None}
# The DeepSeek-V3 folders with the config.json transformers 4.57 wrote for the same model (4.x layout).
CONFIG_4X = {"hf_deepseek_v3_tiny": "hf_deepseek_v3_t4", "hf_deepseek_v3_mtp_tiny": "hf_deepseek_v3_t4"}
V4 = transformers.__version__.split(".")[0] == "4"


def rope_of(config):
    """(theta, scaling) as this transformers version reads them."""
    params = None if V4 else getattr(config, "rope_parameters", None)
    if params:  # 5.x
        p = dict(params)
        return p.pop("rope_theta"), {k: v for k, v in sorted(p.items()) if k != "type"}
    scaling = dict(getattr(config, "rope_scaling", None) or {"rope_type": "default"})  # 4.x Mixtral: none
    scaling.setdefault("rope_type", scaling.pop("type", "default"))
    return config.rope_theta, dict(sorted(scaling.items()))


def main():
    bin_dir = sys.argv[1]
    convert = os.path.join(bin_dir, "convert_checkpoint")
    print(f"transformers {transformers.__version__}, torch {torch.__version__}")
    with open(os.path.join(FIXTURES, "hf_tokens_text_document.bin"), "rb") as f:
        document = torch.tensor(list(memoryview(f.read()).cast("H")), dtype=torch.long)
    tokens = document[:16].view(2, 8)
    failures = 0
    with tempfile.TemporaryDirectory() as work:
        for name, weights in FOLDERS.items():
            source = os.path.join(FIXTURES, name)
            if weights:
                source = os.path.join(work, name + "_in")
                os.makedirs(source)
                os.symlink(os.path.join(FIXTURES, name, "config.json"), os.path.join(source, "config.json"))
                os.symlink(os.path.join(FIXTURES, weights, "model.safetensors"),
                           os.path.join(source, "model.safetensors"))
            if name in MTP_FOLDERS:
                source = os.path.join(work, name + "_in")
                os.makedirs(source)
                for file in os.listdir(os.path.join(FIXTURES, name)):
                    os.symlink(os.path.join(FIXTURES, name, file), os.path.join(source, file))
                os.symlink(os.path.join(FIXTURES, MTP_FOLDERS[name], "model.safetensors"),
                           os.path.join(source, "model-00001-of-00002.safetensors"))
            ckpt, export = os.path.join(work, name + "_ckpt"), os.path.join(work, name + "_export")
            env = dict(os.environ, PARALLEL_LOG_LEVEL="warn")
            subprocess.run([convert, "--from", "hf", "--input", source, "--output", ckpt], check=True, env=env)
            subprocess.run([convert, "--to", "hf", "--input", ckpt, "--output", export], check=True, env=env)

            if V4 and name in SAME_MODEL_4X and SAME_MODEL_4X[name] is None:
                print(f"{name}: skipped under 4.x (no 4.x-layout fixture of the same model)")
                continue
            reference = os.path.join(FIXTURES, SAME_MODEL_4X[name]) if V4 and name in SAME_MODEL_4X else source
            if V4 and name.startswith("hf_qwen3_moe"):
                # transformers 5 names the expert count num_local_experts, 4.x num_experts (the
                # export writes both): the source folder, with 4.x's name added, is the reference.
                reference = os.path.join(work, name + "_4x")
                os.makedirs(reference)
                with open(os.path.join(source, "config.json")) as f:
                    config = json.load(f)
                config["num_experts"] = config["num_local_experts"]
                with open(os.path.join(reference, "config.json"), "w") as f:
                    json.dump(config, f)
                os.symlink(os.path.join(source, "model.safetensors"), os.path.join(reference, "model.safetensors"))
            if V4 and name in CONFIG_4X:
                reference = os.path.join(work, name + "_4x")
                os.makedirs(reference)
                os.symlink(os.path.join(FIXTURES, CONFIG_4X[name], "config.json"), os.path.join(reference, "config.json"))
                os.symlink(os.path.join(FIXTURES, MTP_FOLDERS.get(name, name), "model.safetensors"),
                           os.path.join(reference, "model.safetensors"))
            # MoE layers: the plain per-expert loop (transformers 5's default grouped kernels differ
            # in the last bits).
            kw = {} if V4 else {"experts_implementation": "eager"}
            original = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32, **kw)
            model, info = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32, output_loading_info=True,
                                                               **kw)
            mtp_keys = []
            if name in MTP_FOLDERS:
                layer = f"model.layers.{AutoConfig.from_pretrained(export).num_hidden_layers}."
                mtp_keys = sorted(k for k in info["unexpected_keys"] if k.startswith(layer))
                info["unexpected_keys"] = [k for k in info["unexpected_keys"] if not k.startswith(layer)]
                if not mtp_keys:
                    info["unexpected_keys"].append(f"(none under {layer}*: the export lacks its MTP layer?)")
            problems = {k: v for k, v in info.items() if v and k != "error_msgs"}
            if info.get("error_msgs"):
                problems["error_msgs"] = info["error_msgs"]
            c0, c1 = AutoConfig.from_pretrained(reference), AutoConfig.from_pretrained(export)
            if type(model) is not type(original):
                problems["class"] = f"{type(model).__name__}, not {type(original).__name__}"
            if rope_of(c0) != rope_of(c1):
                problems["rope"] = f"{rope_of(c1)}, not {rope_of(c0)}"
            if getattr(c0, "sliding_window", None) != getattr(c1, "sliding_window", None):
                problems["sliding_window"] = f"{c1.sliding_window}, not {c0.sliding_window}"
            for key in MOE_KEYS:
                # A key this version's config class does not have (4.57's DeepseekV3Config has no
                # output_router_logits, which the export writes as 5.x does) is not compared.
                if getattr(c0, key, None) is None:
                    continue
                if getattr(c0, key, None) != getattr(c1, key, None):
                    problems[key] = f"{getattr(c1, key, None)}, not {getattr(c0, key, None)}"
            with torch.no_grad():
                a, b = original(input_ids=tokens).logits, model(input_ids=tokens).logits
            diff = ((a - b).abs().max() / a.abs().max()).item()
            if diff > 1e-6:
                problems["logits"] = f"max difference {diff:.1e} of the largest"
            status = "ok" if not problems else f"FAILED {problems}"
            print(f"{name}: {type(model).__name__}, rope {rope_of(c1)}, sliding_window "
                  f"{getattr(c1, 'sliding_window', None)}, logits max difference {diff:.1e}"
                  f"{f', {len(mtp_keys)} MTP tensors unexpected (ignored)' if mtp_keys else ''}: {status}")
            failures += bool(problems)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
