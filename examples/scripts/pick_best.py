#!/usr/bin/env python3
"""Reads every $EXAMPLE_OUT/sweep/run-*.json written by train.py and reports the best run.

Writes $EXAMPLE_OUT/sweep/best.json. Exits 1 if no run finished with a finite loss.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path


def out_dir() -> Path:
    return Path(os.environ.get("EXAMPLE_OUT") or Path(tempfile.gettempdir()) / "cuectl-examples")


def main() -> int:
    sweep = out_dir() / "sweep"
    runs = [json.loads(p.read_text()) for p in sorted(sweep.glob("run-*.json"))]
    finished = [r for r in runs if r.get("loss") is not None]
    for r in runs:
        print(f"lr={r['lr']:<6} loss={r['loss']}")
    if not finished:
        print(f"no finished runs under {sweep}", file=sys.stderr)
        return 1
    best = min(finished, key=lambda r: r["loss"])
    (sweep / "best.json").write_text(json.dumps(best, indent=2) + "\n")
    print(f"best: lr={best['lr']} loss={best['loss']:.6f} ({len(finished)}/{len(runs)} runs converged)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
