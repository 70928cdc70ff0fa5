#!/usr/bin/env python3
"""Stand-in for a renderer: "renders" one frame as a small PPM image.

Usage: render.py FRAME

The picture (a disc that moves with the frame number over a gradient) is computed from
the frame number alone, so every run of a frame writes the same bytes. Output goes to
$EXAMPLE_OUT/render/frame.NNNN.ppm (EXAMPLE_OUT defaults to <tmp>/cuectl-examples).
It prints the devices cuectl granted, so a frame log shows the GPU isolation at work.
Standard library only: runs anywhere, no GPU or renderer needed.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
import time
from pathlib import Path

WIDTH, HEIGHT = 64, 48


def out_dir() -> Path:
    return Path(os.environ.get("EXAMPLE_OUT") or Path(tempfile.gettempdir()) / "cuectl-examples")


def pixel(x: int, y: int, frame: int) -> tuple[int, int, int]:
    # A disc orbiting the centre (a quarter radian per frame) over a diagonal gradient.
    cx = WIDTH / 2 + 16 * math.cos(frame / 4)
    cy = HEIGHT / 2 + 12 * math.sin(frame / 4)
    if (x - cx) ** 2 + (y - cy) ** 2 <= 64:
        return (255, 200, 40)
    return ((x * 4) % 256, (y * 5) % 256, (frame * 10) % 256)


def render(frame: int) -> bytes:
    header = f"P6\n{WIDTH} {HEIGHT}\n255\n".encode("ascii")
    body = bytearray()
    for y in range(HEIGHT):
        for x in range(WIDTH):
            body.extend(pixel(x, y, frame))
    return header + bytes(body)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: render.py FRAME", file=sys.stderr)
        return 2
    frame = int(argv[1])
    print(f"render frame {frame}: CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '<unset>')} "
          f"CUE_GPUS={os.environ.get('CUE_GPUS', '<unset>')} CUE_GPU_UUIDS={os.environ.get('CUE_GPU_UUIDS', '<unset>')}")
    time.sleep(float(os.environ.get("RENDER_SLEEP", "0.2")))  # pretend this took a while
    target = out_dir() / "render" / f"frame.{frame:04d}.ppm"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".ppm.partial")
    partial.write_bytes(render(frame))
    partial.replace(target)  # a retried or killed frame never leaves half an image behind
    print(f"wrote {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
