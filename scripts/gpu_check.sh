#!/usr/bin/env bash
# A CUDA host checked before its figures (scripts/gpu_figures.sh): the GPU and torch as the host has
# them, `cadence doctor`, the tests parametrised by device (they add "cuda" where torch sees one; CUDA
# IPC between two processes in test_device_memory.py), and
# the whole system once on the GPU: `cadence bench e2e` of the quick start's tiny model with the
# trainer and its two workers on the device.
#
#   scripts/gpu_check.sh OUT        (DEVICE=cpu runs the same on the CPU)
set -u
out=${1:?usage: scripts/gpu_check.sh OUT}
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
mkdir -p "$out"
status=0
step() {
  echo "== $*"
  "$@" || { echo "== FAILED ($?): $*"; status=1; }
}
step nvidia-smi
step "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', \
torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)"
step "$py" -m cadence doctor --json --set "trainer.device='$device'" --set "rollout.device='$device'"
step timeout 400 "$py" -m pytest -q -p no:cacheprovider -x tests/unit/test_engine.py tests/unit/test_engine_slots.py \
  tests/unit/test_parallel.py tests/unit/test_doctor.py tests/system/test_doctor.py \
  tests/transport/test_device_memory.py tests/actors/test_device_weights.py tests/actors/test_device_first.py
step timeout 240 "$py" -m cadence bench e2e --json --config configs/quickstart.toml --periods 4 \
  --set "trainer.device='$device'" --set "rollout.device='$device'" --set task.prompts_per_period=4 \
  --set rollout.group_size=8
exit $status
