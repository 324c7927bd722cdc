#!/usr/bin/env python3
"""A libparallel LoRA adapter (convert_checkpoint --to peft) in Hugging Face's PEFT (issue 29): it loads
into the base model with no missing or unexpected keys, both through PeftModel.from_pretrained and
through set_peft_model_state_dict on a model built from its adapter_config.json, and the adapted
model's logits are the PyTorch reference's (tests/reference/make_lora_fixture.py: logits of the
float64 reference after its 3 steps, on step 0's tokens) within 1e-4 of their scale, while the base
model's are not.

    peft_check.py ADAPTER_DIR BASE_MODEL_DIR AFTER3_FIXTURE

Exit 77 (the suite's skip) when torch, transformers or peft cannot be imported, e.g.
    python3 -m pip install --target /tmp/peft peft accelerate
    PYTHONPATH=/tmp/peft:/tmp/hf5:/tmp/torch2 ctest -R peft_check
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import peft
    import torch
    import transformers
    from safetensors.torch import load_file
except ImportError as e:
    print(f"SKIPPED: {e} (python3 -m pip install --target /tmp/peft peft accelerate; "
          "PYTHONPATH=/tmp/peft:/tmp/hf5:/tmp/torch2)")
    sys.exit(77)


def read_fixture(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = {"F32": np.float32, "I32": np.int32}[info["dtype"]]
        a, b = info["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype=dtype).reshape(info["shape"]).copy())
    return out


def base_model(base_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float64,
                                                             attn_implementation="eager")


def main():
    adapter_dir, base_dir, fixture = sys.argv[1:4]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, peft {peft.__version__}")
    ref = read_fixture(fixture)
    tokens, expected = ref["tokens"][0].long(), ref["logits"].double()
    scale = expected.abs().max().item()

    # The key check: every adapter tensor PEFT's model has is in the file, and nothing else.
    config = peft.PeftConfig.from_pretrained(adapter_dir)
    built = peft.get_peft_model(base_model(base_dir), config)
    state = load_file(os.path.join(adapter_dir, "adapter_model.safetensors"))
    result = peft.set_peft_model_state_dict(built, state)
    missing = [k for k in result.missing_keys if "lora_" in k]
    if missing or result.unexpected_keys:
        print(f"missing keys {missing}, unexpected keys {result.unexpected_keys}")
        return 1
    print(f"{len(state)} adapter tensors loaded, no missing or unexpected keys")

    # The way users load it.
    model = peft.PeftModel.from_pretrained(base_model(base_dir), adapter_dir).eval()
    with torch.no_grad():
        got = model(input_ids=tokens).logits.double()
        got_built = built.eval()(input_ids=tokens).logits.double()
        plain = base_model(base_dir).eval()(input_ids=tokens).logits.double()
    err = (got - expected).abs().max().item() / scale
    err_built = (got_built - expected).abs().max().item() / scale
    base_err = (plain - expected).abs().max().item() / scale
    print(f"logits against the reference: from_pretrained {err:.3g}, set_peft_model_state_dict {err_built:.3g}; "
          f"the base model's {base_err:.3g} (relative to max |logit| {scale:.3g})")
    if err > 1e-4 or err_built > 1e-4:
        print("the adapted model's logits differ from the reference")
        return 1
    if base_err < 1e-3:
        print("the adapters do not change the logits: the check could not fail")
        return 1
    print("peft_check: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
