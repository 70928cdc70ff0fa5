#!/usr/bin/env bash
# End-to-end checks of cuectl on a machine with a real NVIDIA GPU (docs/gpu-setup.md,
# "Checking a real GPU machine"). Works offline:
#
#   bash scripts/gpu-e2e.sh                 # real GPUs (NVML, nvidia-smi, CUDA via the
#                                           # machine's cuda-bindings / CuPy / PyTorch)
#   bash scripts/gpu-e2e.sh --fake          # the same checks on fake GPUs (no GPU needed)
#   bash scripts/gpu-e2e.sh --wheels DIR …  # install missing dependencies from DIR
#
# It installs cuectl from this working tree into a throwaway environment — a venv made
# with --system-site-packages, so the machine's PyTorch, CuPy, cuda-bindings and
# nvidia-ml-py are used — with `pip install --no-index --no-deps`; dependencies that the
# machine lacks (typer, rich, pyyaml, psutil, nvidia-ml-py and theirs) come from a wheel
# directory (--wheels DIR, else ./wheels when present), never from the network. Then it
# runs scripts/gpu_e2e.py with the other arguments and exits with its status (0 all
# passed, 1 a check failed, 2 bad usage or no usable environment).
#
# Environment: PYTHON (the interpreter to build on; default python3). When PYTHON is itself
# a virtualenv, a venv made from it would not see its packages, so cuectl is installed
# into a temporary --target directory put on PYTHONPATH instead.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
PY="${PYTHON:-python3}"
wheels=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --wheels) wheels="${2:?--wheels needs a directory}"; shift 2 ;;
    --wheels=*) wheels="${1#--wheels=}"; shift ;;
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; "$PY" "$repo/scripts/gpu_e2e.py" --help; exit 0 ;;
    *) args+=("$1"); shift ;;
  esac
done
if [ -z "$wheels" ] && [ -d "$repo/wheels" ]; then
  wheels="$repo/wheels"
fi
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "gpu-e2e: $PY not found (set PYTHON)" >&2
  exit 2
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/cuectl-gpu-e2e-env.XXXXXX")"
trap 'rm -rf "$work"' EXIT
pipq=(--quiet --disable-pip-version-check --no-input --no-index)
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# A copy of the sources to build from, so the build leaves nothing in the working tree.
mkdir -p "$work/src"
cp -R "$repo/pyproject.toml" "$repo/README.md" "$repo/src" "$work/src/"

in_venv=$("$PY" -c 'import sys; print(int(sys.prefix != sys.base_prefix))')
if [ "$in_venv" = "0" ] && "$PY" -m venv --system-site-packages "$work/venv" >/dev/null 2>&1 \
   && [ -x "$work/venv/bin/python" ] && "$work/venv/bin/python" -m pip --version >/dev/null 2>&1; then
  run_py="$work/venv/bin/python"
  target=()
  mode="venv (--system-site-packages) from $PY"
else
  run_py="$PY"
  mkdir -p "$work/site"
  target=(--target "$work/site")
  export PYTHONPATH="$work/site${PYTHONPATH:+:$PYTHONPATH}"
  mode="--target dir on PYTHONPATH, interpreter $PY"
fi
echo "gpu-e2e: installing cuectl from $repo into a $mode" >&2

# --no-build-isolation: an isolated build would fetch setuptools from the index.
install_cuectl() {
  "$run_py" -m pip install "${pipq[@]}" --no-deps --no-build-isolation ${target[@]+"${target[@]}"} "$work/src" >"$work/pip.log" 2>&1
}
installed=0
if install_cuectl; then
  installed=1
elif grep -q "bdist_wheel" "$work/pip.log" && [ -n "$wheels" ] \
     && "$run_py" -m pip install "${pipq[@]}" --find-links "$wheels" ${target[@]+"${target[@]}"} wheel >/dev/null 2>&1 \
     && install_cuectl; then
  # setuptools < 70.1 builds wheels only with the `wheel` package, taken from the wheels.
  installed=1
fi
if [ "$installed" = "0" ]; then
  # cuectl is pure Python and reads no package metadata: its sources on PYTHONPATH are
  # what an install would give (`python -m cuectl` is used, not the console script).
  echo "gpu-e2e: pip could not build cuectl offline ($(grep -E '^ *error:' "$work/pip.log" | grep -vE 'subprocess-exited|metadata-generation' | head -n 1 | sed 's/^ *//'));" \
       "using the sources directly (PYTHONPATH=$work/src/src)" >&2
  export PYTHONPATH="$work/src/src${PYTHONPATH:+:$PYTHONPATH}"
fi
if ! "$run_py" -c "import cuectl, os, sys; sys.exit(not os.path.realpath(cuectl.__file__).startswith(os.path.realpath('$work')))" >/dev/null 2>&1; then
  echo "gpu-e2e: cuectl from this working tree is not importable by $run_py" >&2
  "$run_py" -c "import cuectl; print(cuectl.__file__)" >&2 || true
  exit 2
fi

# What cuectl needs at run time for these checks, as import name=distribution name.
# (fastapi, uvicorn and friends are only for `cuectl serve`, which the checks do not use.)
needed=(typer=typer rich=rich yaml=pyyaml psutil=psutil)
case " ${args[*]-} " in
  *" --fake "*) ;;
  *) needed+=(pynvml=nvidia-ml-py) ;;
esac
missing=()
for pair in "${needed[@]}"; do
  mod="${pair%%=*}"; dist="${pair#*=}"
  if ! "$run_py" -c "import $mod" >/dev/null 2>&1; then
    missing+=("$dist")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ -z "$wheels" ]; then
    echo "gpu-e2e: missing Python packages: ${missing[*]}" >&2
    echo "  carry them as wheels: on a connected machine with the same Python," >&2
    echo "  \`pip download -d wheels ${missing[*]}\`, copy wheels/ into the repository (or pass --wheels DIR)" >&2
    exit 2
  fi
  echo "gpu-e2e: installing ${missing[*]} from $wheels" >&2
  if ! "$run_py" -m pip install "${pipq[@]}" --find-links "$wheels" "${target[@]}" "${missing[@]}" >"$work/pip-deps.log" 2>&1; then
    echo "gpu-e2e: pip could not install ${missing[*]} from $wheels:" >&2
    tail -n 20 "$work/pip-deps.log" >&2
    exit 2
  fi
fi

status=0
"$run_py" "$repo/scripts/gpu_e2e.py" ${args[@]+"${args[@]}"} || status=$?
exit "$status"
