"""Console-script entry point, kept import-light.

``cuectl --version`` is answered here without importing typer (~180 ms); everything else
loads the full command tree from ``cuectl.cli.main``.
"""

from __future__ import annotations

import sys


def run() -> None:
    if sys.argv[1:] == ["--version"]:
        from cuectl import __version__

        sys.stdout.write(f"cuectl {__version__}\n")
        return
    from cuectl.cli.main import app

    app()
