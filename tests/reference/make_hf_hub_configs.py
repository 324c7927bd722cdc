#!/usr/bin/env python3
"""Writes tests/reference/fixtures/hf_hub_configs.json: the config.json of the Hugging Face models
people fine-tune in the families convert_checkpoint reads (GPT-2, Llama 2/3/3.1/3.2, Mistral 7B v0.1/v0.3,
Qwen2/2.5), in every layout transformers writes, for
tests/unit/test_hf_model.cpp (ReadsTheHubConfigsOfEverySupportedFamily): each must import, with its
rotary embedding. The key table of src/io/hf_model.cpp refuses any key it does not know, so this is
the check that real configs carry only known keys.

  NAME              the config.json as published on the hub (written by transformers 4.x; typed
                    in here key for key)
  NAME@5-saved      what transformers 5 writes for it: Config.from_dict(published).save_pretrained
                    (rope_parameters, no rope_theta / rope_scaling / torch_dtype)
  NAME@5-to_dict    transformers 5's Config.to_dict(): every attribute, the generic ones included
  NAME@4-to_dict    the same from transformers 4.x (run the script once with each version; entries
                    of the other version are kept)

  PYTHONPATH=/tmp/hf5 python3 tests/reference/make_hf_hub_configs.py   # transformers 5.x
  PYTHONPATH=/tmp/hf4 python3 tests/reference/make_hf_hub_configs.py   # transformers 4.x
(transformers' config classes need no PyTorch.)
"""

import copy
import json
import os
import tempfile

import transformers
from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "hf_hub_configs.json")

LLAMA3_SCALING = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192, "rope_type": "llama3"}
PUBLISHED = {
    "openai-community/gpt2": {
        "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
        "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
        "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768, "n_head": 12,
        "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "summary_activation": None,
        "summary_first_dropout": 0.1, "summary_proj_to_labels": True, "summary_type": "cls_index",
        "summary_use_proj": True, "task_specific_params": {"text-generation": {"do_sample": True, "max_length": 50}},
        "vocab_size": 50257},
    "meta-llama/Llama-2-7b-hf": {
        "_name_or_path": "meta-llama/Llama-2-7b-hf", "architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
        "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
        "intermediate_size": 11008, "max_position_embeddings": 4096, "model_type": "llama",
        "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1,
        "rms_norm_eps": 1e-05, "rope_scaling": None, "tie_word_embeddings": False, "torch_dtype": "float16",
        "transformers_version": "4.31.0.dev0", "use_cache": True, "vocab_size": 32000},
    "meta-llama/Meta-Llama-3-8B": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096,
        "initializer_range": 0.02, "intermediate_size": 14336, "max_position_embeddings": 8192,
        "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
        "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 500000.0,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.40.0.dev0",
        "use_cache": True, "vocab_size": 128256},
    "meta-llama/Llama-3.1-8B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": LLAMA3_SCALING, "rope_theta": 500000.0, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.42.3", "use_cache": True, "vocab_size": 128256},
    "meta-llama/Llama-3.2-1B": {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu", "hidden_size": 2048,
        "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
        "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
        "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
        "rope_scaling": dict(LLAMA3_SCALING, factor=32.0), "rope_theta": 500000.0, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.45.0.dev0", "use_cache": True,
        "vocab_size": 128256},
    "mistralai/Mistral-7B-v0.1": {
        "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu",
        "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
        "sliding_window": 4096, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000},
    "mistralai/Mistral-7B-v0.3": {
        "architectures": ["MistralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1, "eos_token_id": 2,
        "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
        "max_position_embeddings": 32768, "model_type": "mistral", "num_attention_heads": 32,
        "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 1000000.0,
        "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "transformers_version": "4.42.0.dev0", "use_cache": True, "vocab_size": 32768},
    "Qwen/Qwen2-7B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.37.2", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 152064},
    "Qwen/Qwen2.5-0.5B-Instruct": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
        "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
        "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": True,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 151936},
    "Qwen/Qwen2.5-7B": {
        "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
        "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 3584, "initializer_range": 0.02,
        "intermediate_size": 18944, "max_position_embeddings": 131072, "max_window_layers": 28,
        "model_type": "qwen2", "num_attention_heads": 28, "num_hidden_layers": 28, "num_key_value_heads": 4,
        "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072, "tie_word_embeddings": False,
        "torch_dtype": "bfloat16", "transformers_version": "4.43.1", "use_cache": True,
        "use_sliding_window": False, "vocab_size": 152064},
}
CLASSES = {"gpt2": GPT2Config, "llama": LlamaConfig, "mistral": MistralConfig, "qwen2": Qwen2Config}


def plain(d):
    """JSON-able (to_dict may hold non-JSON values such as dtype objects)."""
    return json.loads(json.dumps(d, default=str))


def main():
    major = transformers.__version__.split(".")[0]
    print(f"transformers {transformers.__version__}")
    out = {}
    if os.path.exists(OUT):
        with open(OUT) as f:
            out = json.load(f)
    for name, published in PUBLISHED.items():
        out[name] = published
        config = CLASSES[published["model_type"]].from_dict(copy.deepcopy(published))  # from_dict edits it
        full = plain(config.to_dict())
        out[f"{name}@{major}-to_dict"] = full
        if major == "5":
            with tempfile.TemporaryDirectory() as d:
                config.save_pretrained(d)
                with open(os.path.join(d, "config.json")) as f:
                    out[f"{name}@5-saved"] = json.load(f)
        print(f"{name}: {sorted(set(full) - set(published))} added by to_dict")
    with open(OUT, "w") as f:  # one config a line
        f.write("{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(out.items()))
                + "\n}\n")
    print(f"wrote {os.path.relpath(OUT)} ({len(out)} configs)")


if __name__ == "__main__":
    main()
