"""A tiny Prometheus text-exposition parser for the report tests (imported through
sys.path, which tests/report/conftest.py extends)."""

from __future__ import annotations

import re

SAMPLE_RE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$")
LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')


def parse_prometheus(text: str) -> tuple[dict[tuple[str, frozenset], float], dict[str, str]]:
    """A tiny text-exposition parser: samples keyed by (name, labels), and each family's
    TYPE. Fails on anything malformed, on a family declared twice, or on samples of a
    family that are not contiguous under its HELP/TYPE."""
    samples: dict[tuple[str, frozenset], float] = {}
    types: dict[str, str] = {}
    current = None
    assert text.endswith("\n")
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in types, f"family {name} declared twice"
            current = name
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name == current
            types[name] = kind
        else:
            m = SAMPLE_RE.match(line)
            assert m, f"bad sample line: {line!r}"
            assert m["name"] == current, f"{m['name']} outside its family"
            labels_text = m["labels"] or ""
            pairs = LABEL_RE.findall(labels_text)
            assert "".join(f'{k}="{v}",' for k, v in pairs).rstrip(",") == labels_text
            labels = frozenset((k, v.replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")) for k, v in pairs)
            key = (m["name"], labels)
            assert key not in samples, f"duplicate series {key}"
            samples[key] = float(m["value"])
    return samples, types
