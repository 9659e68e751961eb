"""Print what the triton matmul_backward tuner tried on one CUDA case, and its choice (one JSON line).

    python scripts/gpu/tuner_log.py M K N [dtype]     (a: M x K, b: K x N, contiguous; dtype f32 by default)

The tuner times each candidate plan with CUDA events on the first checked call (backends/triton/_conv.py
Tuner.pick); its log is the per-candidate A/B (the staged float32 candidates included)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str]) -> None:
    import torch

    from backends.triton import matmul_backward as mmb

    m, k, n = map(int, argv[:3])
    dt = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}[argv[3] if len(argv) > 3 else "f32"]
    g = torch.Generator(device="cuda").manual_seed(0)
    a, b, dy = (torch.randn(s, generator=g, device="cuda").to(dt) for s in ((m, k), (k, n), (m, n)))
    outs = {"da": torch.empty_like(a), "db": torch.empty_like(b)}
    mmb.matmul_backward({"a": a, "b": b, "dy": dy}, outs, {})
    torch.cuda.synchronize()
    print(json.dumps({"case": [m, k, n, str(dt)], "log": {str(key): v for key, v in mmb.TUNER.log.items()}}))


if __name__ == "__main__":
    main(sys.argv[1:])
