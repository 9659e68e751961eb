"""The float64 passes of large cases on the GPU (oracle.passes, $GRADORACLE_ORACLE_PASSES=cuda) beside
the host's numpy: for each attention perf case given (default: two mid-size ones), `prepare` twice
with the same seed, then the inputs compared bit for bit after their rounding to the case dtype, the
error scales to float64 rounding, and the seconds each took.  Run on a CUDA machine, repo root:

    python scripts/gpu/oracle_passes.py [CASE_ID ...]     (ids as `harness list-cases` prints them)

Exit status 1 if more than 10 input elements differ (a float64 forward that differs in its last bit
may round o or lse the other way, rarely) or a scale is off by more than 1e-10 relative.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cases import select  # noqa: E402
from harness import prepare  # noqa: E402
from harness.prepared import PASSES_ENV  # noqa: E402

DEFAULT = ("attn[bf16,B=1,Sq=2048,Sk=2048,Hq=32,Hkv=8,D=128,causal]",
           "attn[bf16,B=16,Sq=1024,Sk=1024,Hq=16,Hkv=16,D=128]")  # over 1e11 flops: 20-30 s each on the host


def timed_prepare(case, mode: str):
    os.environ[PASSES_ENV] = mode
    started = time.perf_counter()
    got = prepare.prepare(case, 0, "auto", "cuda", cache=False, defer_gpu=True)  # the JAX oracle is not compared
    return got, time.perf_counter() - started


def main(ids) -> int:
    by_id = {c.id: c for c in select("perf", op="attention_backward")}
    bad = 0
    for cid in ids or DEFAULT:
        case = by_id[cid]
        host, host_s = timed_prepare(case, "cpu")
        dev, dev_s = timed_prepare(case, "cuda")
        differ = sum(int(np.sum(~((host.inputs64[n] == dev.inputs64[n]) |
                                  (np.isnan(host.inputs64[n]) & np.isnan(dev.inputs64[n]))))) for n in host.inputs64)
        worst = max(float(np.max(np.abs(dev.scale[n][0] - host.scale[n][0]) /
                                 np.maximum(np.abs(host.scale[n][0]), 1e-300))) for n in host.scale)
        ok = differ <= 10 and worst <= 1e-10 and all(dev.scale[n][1] == host.scale[n][1] for n in host.scale)
        bad += not ok
        print(f"{'OK ' if ok else 'BAD'} {cid}: host {host_s:.1f} s, GPU {dev_s:.1f} s; inputs "
              f"{differ} elements differ; error scale max rel diff {worst:.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
