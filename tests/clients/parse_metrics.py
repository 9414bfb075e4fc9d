#!/usr/bin/env python3
"""Parse a Prometheus text exposition (latchkey's GET /metrics) the way Prometheus users do.

Usage: parse_metrics.py < metrics.txt

Parses stdin with `prometheus_client.parser.text_string_to_metric_families` (which raises on a
malformed exposition), checks what that parser does not (sample names belong to their family,
histogram buckets are cumulative and end in +Inf equal to _count), and prints JSON:

    {"families": [{"name": str, "type": str, "help": str,
                   "samples": [{"name": str, "labels": {str: str}, "value": float | str}]}]}

A non-finite value is printed as a string ("NaN", "+Inf", "-Inf"). Exit 1 with the reason on
stderr if the text does not parse or breaks a check.
"""

import json
import math
import sys
from collections import defaultdict

from prometheus_client.parser import text_string_to_metric_families

SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
    "untyped": ("",),
    "unknown": ("",),
}


def value(v: float):
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return v


def check_histogram(family) -> None:
    """Buckets per label set: cumulative, ending in +Inf, which equals _count."""
    buckets = defaultdict(list)
    counts = {}
    for s in family.samples:
        key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        if s.name.endswith("_bucket"):
            buckets[key].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_count"):
            counts[key] = s.value
    for key, series in buckets.items():
        series.sort()
        if series[-1][0] != math.inf:
            raise ValueError(f"{family.name}{dict(key)}: no +Inf bucket")
        for (_, a), (le, b) in zip(series, series[1:]):
            if b < a:
                raise ValueError(f"{family.name}{dict(key)}: bucket le={le} decreases")
        if counts.get(key) != series[-1][1]:
            raise ValueError(f"{family.name}{dict(key)}: _count {counts.get(key)} != +Inf bucket")


def main() -> int:
    text = sys.stdin.read()
    try:
        families = list(text_string_to_metric_families(text))
        out = []
        for f in families:
            for s in f.samples:
                if not any(s.name == f.name + sfx for sfx in SUFFIXES.get(f.type, ("",))):
                    raise ValueError(f"sample {s.name} does not belong to {f.type} {f.name}")
                if f.type == "counter" and s.value < 0:
                    raise ValueError(f"counter sample {s.name} is negative")
            if f.type == "histogram":
                check_histogram(f)
            out.append(
                {
                    "name": f.name,
                    "type": f.type,
                    "help": f.documentation,
                    "samples": [
                        {"name": s.name, "labels": dict(s.labels), "value": value(s.value)}
                        for s in f.samples
                    ],
                }
            )
    except Exception as e:  # the parser raises ValueError and others on bad input
        print(f"metrics do not parse: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"families": out}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
