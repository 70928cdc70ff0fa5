#!/usr/bin/env python3
"""Stand-in for a compositor: reads rendered frame N and writes a greyscale version.

Usage: comp.py FRAME

Reads $EXAMPLE_OUT/render/frame.NNNN.ppm (written by render.py) and writes
$EXAMPLE_OUT/comp/frame.NNNN.pgm. Exits 1 when the rendered frame is missing or broken,
which is what a frame-by-frame dependency on the render layer prevents.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path


def out_dir() -> Path:
    return Path(os.environ.get("EXAMPLE_OUT") or Path(tempfile.gettempdir()) / "cuectl-examples")


def read_ppm(path: Path) -> tuple[int, int, bytes]:
    data = path.read_bytes()
    parts = data.split(b"\n", 3)
    if len(parts) != 4 or parts[0] != b"P6" or parts[2] != b"255":
        raise ValueError(f"{path}: not a binary PPM written by render.py")
    width, height = (int(v) for v in parts[1].split())
    pixels = parts[3]
    if len(pixels) != width * height * 3:
        raise ValueError(f"{path}: truncated image")
    return width, height, pixels


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: comp.py FRAME", file=sys.stderr)
        return 2
    frame = int(argv[1])
    source = out_dir() / "render" / f"frame.{frame:04d}.ppm"
    try:
        width, height, rgb = read_ppm(source)
    except (OSError, ValueError) as exc:
        print(f"comp frame {frame}: cannot read the rendered frame: {exc}", file=sys.stderr)
        return 1
    # ITU-R BT.601 luma, integer arithmetic.
    grey = bytes((299 * rgb[i] + 587 * rgb[i + 1] + 114 * rgb[i + 2]) // 1000 for i in range(0, len(rgb), 3))
    target = out_dir() / "comp" / f"frame.{frame:04d}.pgm"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".pgm.partial")
    partial.write_bytes(f"P5\n{width} {height}\n255\n".encode("ascii") + grey)
    partial.replace(target)
    print(f"comp frame {frame}: mean luma {sum(grey) / len(grey):.1f}; wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
