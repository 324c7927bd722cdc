#!/usr/bin/env bash
# The exports of convert_checkpoint loaded by transformers itself (tests/reference/check_hf_export.py:
# no missing, unexpected or mismatched keys, the source's architecture class, rope and window, the
# source's logits). transformers and PyTorch are not dependencies: they come from side folders,
# PARALLEL_HF_PYTHONPATH (default /tmp/hf5:/tmp/torch2, as tests/reference's docstrings install them);
# without them the test is skipped (77).
#   hf_export_transformers.sh SOURCE_DIR CONVERT_CHECKPOINT [MPIEXEC...]
set -euo pipefail
src=$1 convert=$2
export PYTHONPATH=${PARALLEL_HF_PYTHONPATH:-/tmp/hf5:/tmp/torch2}
if ! command -v python3 >/dev/null || ! python3 -c 'import torch, transformers' >/dev/null 2>&1; then
  echo "skipped: python3 cannot import torch and transformers (PYTHONPATH=$PYTHONPATH)"
  exit 77
fi
exec python3 "$src/tests/reference/check_hf_export.py" "$(dirname "$convert")"
