"""Which cuDNN choice makes the f32 wgrad baselines miss the float32 model (results/h100/baselines-full)?

Runs each failing case through torch's wgrad under several backend settings and prints each
one's worst err/tol against the float64 oracle: if true-f32 paths (cuDNN off, CPU) pass and
the default cuDNN path does not, the algorithm cuDNN picks is the cause, not the model.
    python scripts/diag/conv_wgrad_algorithms.py
"""
import contextlib

import torch

from backends.baselines._torch_autograd import conv_backward_weight as tw
from cases import select
from harness.compare import compare
from harness.runner import prepare

FAILING = [
    "wgrad2d[f32,N=8,C=64->128,HW=28x28,k=3x3,s=1,p=1,d=1,g=2,nchw]",
    "wgrad2d[f32,N=1,C=3->64,HW=64x64,k=3x3,s=1,p=1,d=1,g=1,nchw]",
    "wgrad2d[f32,N=32,C=64->64,HW=56x56,k=3x3,s=1,p=1,d=1,g=1,nhwc]",
]


@contextlib.contextmanager
def cudnn(**flags):
    with torch.backends.cudnn.flags(**{k: v for k, v in flags.items()}):
        yield


SETTINGS = {
    "cuda default (the torch baseline)": ("cuda", {}),
    "cuda cudnn.deterministic": ("cuda", {"enabled": True, "deterministic": True}),
    "cuda cudnn.benchmark": ("cuda", {"enabled": True, "benchmark": True}),
    "cuda cudnn disabled (ATen native)": ("cuda", {"enabled": False}),
    "cpu (oneDNN / im2col GEMM)": ("cpu", None),
}

cases = {c.id: c for c in select("full") if c.op == "conv_backward_weight"}
for cid in FAILING:
    case = cases[cid]
    prep = prepare(case, 0)
    scale, n = prep.scale["dw"]
    print(cid, "reduction length", n)
    for label, (dev, flags) in SETTINGS.items():
        inputs = {k: torch.from_numpy(v.view.copy()).to(dev) for k, v in prep.inputs.items()}
        ctx = cudnn(**flags) if flags is not None else contextlib.nullcontext()
        with ctx:
            dw = tw.backward(inputs, dict(case.params))["dw"]
        rep = compare("dw", dw.double().cpu().numpy(), prep.ref["dw"], scale, n, case.dtype)
        print(f"  {label:36} err/tol={rep.worst_ratio:7.3f} rel_l2={rep.rel_l2:.2e} {'PASS' if rep.passed else 'FAIL'}")
