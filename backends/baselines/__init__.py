"""The baselines: the libraries a kernel is measured against, one backend per module, each
module named for its backend.

    torch.py          `torch`: eager autograd (the baseline every speedup is against)
    torch_compile.py  `torch_compile`: the same autograd code under torch.compile (CUDA)
    jax.py            `jax`: each op's jax.vjp, jitted by XLA
    sdpa.py           `sdpa_flash`, `sdpa_cudnn`, `sdpa_efficient`: torch's fused attention
    flash_attn.py     `flash_attn`: the flash-attention 2 package, when installed
    liger.py          `liger`: Liger-Kernel's norm backward kernels, when installed

Helpers they share have a leading underscore and are not backends: `_torch_autograd/` (one
module per op, the autograd code that `torch` and `torch_compile` both run) and
`_deviations.py` (measured, explained differences from the spec, reported XFAIL).

What may be touched: add a library as a new module here (harness.registry.discover imports
every module without a leading underscore); give `torch` / `torch_compile` a new op by adding
`_torch_autograd/<op>.py`.  A module here imports the library it wraps with a plain absolute
import (`import torch` in torch.py gets the real torch: Python 3 imports are absolute), never
`from . import`.  Kernels of our own go in backends/, not here.
"""
