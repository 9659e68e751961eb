"""Backends: everything that computes an op's gradients for the harness to judge.

Each backend is a module or package named for the backend; harness.registry.discover imports
every name here and in `baselines/` that has no leading underscore.

    triton/       `triton`: Triton kernels, one module per op (triton/<op>.py)
    cupy/         `cupy`: raw CUDA through NVRTC; host launch code, one module per op (cupy/<op>.py)
    torch_ext/    `torch_ext`: C++/CUDA torch.library ops, one build (<op>.cpp, <op>_cuda.cu, <op>.py)
    baselines/    the libraries a kernel is measured against (torch, torch_compile, jax, sdpa,
                  flash_attn, liger), one module per backend
    cuda/         CUDA device code, one <op>.cuh per op (+ what host C++ shares with it), written
                  once and compiled by both cupy (NVRTC) and torch_ext (nvcc); no Python
    _plans/       host-side plans several kernel backends share, pure Python (<op>.py,
                  <op>_cuda.py: the launch plan of cuda/<op>.cuh)
    _buffers.py   buffer checks every backend shares (byte spans, overlap)

What may be touched: a new kernel for an op is a new file in the backend's package
(triton/<op>.py; cupy/<op>.py with cuda/<op>.cuh; torch_ext/<op>.cpp + <op>_cuda.cu + <op>.py),
registered with harness.argcheck.register on that package's Backend; a new backend is a new
package here (or an installed package in the `gradoracle.backends` entry-point group); a new
baseline library is a new module in baselines/.  Shared pieces live once: a plan two backends
need goes in _plans/, device code two hosts compile goes in cuda/, never a copy.  Nothing here
may import harness drivers (run, bench, cli): only harness.registry, harness.argcheck,
harness.dtypes and the oracle modules.
"""
