"""What a user gets from torch with no custom kernel: one module per op, shared by the
`torch` (eager) and `torch_compile` backends so both run the very same code.

Each module defines OP (the op name), `backward(inputs, params) -> {output: tensor}` and
may define DTYPES and `supports(case) -> reason | None`.
"""
from __future__ import annotations

import importlib
import pkgutil


def modules() -> list:
    return [importlib.import_module(f"{__name__}.{m.name}") for m in pkgutil.iter_modules(__path__)]
