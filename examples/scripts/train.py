#!/usr/bin/env python3
"""Stand-in for a training run: fits y = 3x + 2 by plain gradient descent.

Usage: train.py INDEX [LR,LR,...]

The frame number INDEX (1-based) picks the learning rate from the comma list (default
$SWEEP_LRS, else 0.5,0.2,0.1,0.05,0.02,0.01), so one layer's frames are a sweep. Runs
$TRAIN_STEPS steps (default 200) on 32 fixed points; fully deterministic. Writes
$EXAMPLE_OUT/sweep/run-INDEX.json with the final loss and parameters.
Standard library only (no numpy), no GPU needed.
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
from pathlib import Path

DEFAULT_LRS = "0.5,0.2,0.1,0.05,0.02,0.01"


def out_dir() -> Path:
    return Path(os.environ.get("EXAMPLE_OUT") or Path(tempfile.gettempdir()) / "cuectl-examples")


def dataset() -> list[tuple[float, float]]:
    # 32 points on y = 3x + 2 with a small deterministic wiggle standing in for noise.
    return [(x / 16, 3 * (x / 16) + 2 + 0.05 * math.sin(x)) for x in range(32)]


def train(lr: float, steps: int) -> dict[str, float]:
    w = b = 0.0
    data = dataset()
    n = len(data)
    loss = math.inf
    for _ in range(steps):
        grad_w = grad_b = loss = 0.0
        for x, y in data:
            err = w * x + b - y
            loss += err * err / n
            grad_w += 2 * err * x / n
            grad_b += 2 * err / n
        if loss > 1e6:
            # Diverged: a too-large learning rate is a legitimate sweep result, not a crash.
            return {"loss": None, "diverged": True, "w": w, "b": b}
        w -= lr * grad_w
        b -= lr * grad_b
    return {"loss": loss, "diverged": False, "w": w, "b": b}


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print("usage: train.py INDEX [LR,LR,...]", file=sys.stderr)
        return 2
    index = int(argv[1])
    grid = [float(v) for v in (argv[2] if len(argv) == 3 else os.environ.get("SWEEP_LRS", DEFAULT_LRS)).split(",")]
    if not 1 <= index <= len(grid):
        print(f"index {index} is outside the sweep of {len(grid)} learning rates", file=sys.stderr)
        return 2
    lr, steps = grid[index - 1], int(os.environ.get("TRAIN_STEPS", "200"))
    print(f"run {index}: lr={lr} steps={steps} CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')}")
    result = {"index": index, "lr": lr, "steps": steps, **train(lr, steps),
              "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}
    target = out_dir() / "sweep" / f"run-{index:03d}.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(result, indent=2) + "\n")
    print(f"run {index}: loss={result['loss']} diverged={result['diverged']}; wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
