"""Print what a triton tuner tried on each case of a case file, and its choice (one JSON line a case).

    python scripts/gpu/tuner_log.py CASES.json [...]     (matmul_backward, conv_backward_data, conv_backward_weight)

Each case's inputs (the harness's generator, seed 0) go to the GPU and the op's triton entry is called
once, checked: on a shape class's first checked call the tuner times every candidate plan with CUDA
events (backends/triton/_conv.py Tuner.pick).  Its log is the per-candidate A/B: the staged float32
matmul candidates and the channel-major float32 dgrad ones among them."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

TUNED = ("matmul_backward", "conv_backward_data", "conv_backward_weight")


def main(paths: list[str]) -> None:
    import torch

    from cases.registry import load_file
    from harness.frameworks import adapter
    from harness.prepare import generate
    from harness.registry import find_impl, get_op

    torch_ = adapter("torch")
    for case in (c for p in paths for c in load_file(p)):
        if case.op not in TUNED:
            raise SystemExit(f"tuner_log: {case.id}: {case.op} has no triton tuner (expected one of {TUNED})")
        spec, mod = get_op(case.op), importlib.import_module(f"backends.triton.{case.op}")
        inputs = {k: torch_.to_device(t, "cuda") for k, t in generate(case).items()}
        shapes = spec.shapes(case)
        outs = {k: torch.empty(shapes[k], dtype=next(iter(inputs.values())).dtype, device="cuda") for k in spec.outputs}
        before = set(mod.TUNER.log)
        find_impl(case.op, "triton").fn(inputs, outs, case.params)
        torch.cuda.synchronize()
        log = {str(k): v for k, v in mod.TUNER.log.items() if k not in before}
        print(json.dumps({"case": case.id, "log": log}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
