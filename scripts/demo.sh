#!/usr/bin/env bash
# The main job: install cuectl, submit the example render (a GPU layer and a comp layer
# that follows it frame by frame) and drain it with a worker — on this machine's GPUs
# when discovery finds any, otherwise on the example fake GPUs — then show the frames.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
export CUECTL_DB="${CUECTL_DB:-$PWD/.demo/cuectl.db}"
export EXAMPLE_OUT="${EXAMPLE_OUT:-$PWD/.demo/out}"
mkdir -p "$(dirname "$CUECTL_DB")"

if [ -z "${CUECTL_FAKE_GPUS:-}" ]; then
  found=$(cuectl gpu list --json | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["devices"]))')
  if [ "$found" = "0" ]; then
    export CUECTL_FAKE_GPUS="$PWD/examples/fake-gpus.yaml"
    echo "No GPU found on this machine: using the example fake GPUs ($CUECTL_FAKE_GPUS)."
  else
    echo "Found $found GPU(s) on this machine: frames run on them."
  fi
fi
cuectl gpu list
job=$(cuectl submit examples/render.yaml)
echo "Submitted job $job; running a worker until the queue is idle…"
cuectl worker --until-idle --poll 0.2
cuectl job show "$job"
cuectl frame list --job "$job"
echo "Frame images are in $EXAMPLE_OUT; logs: cuectl frame log FRAME_ID"
