"""Reference oracles: one module per op, each declaring the op (harness.registry.OpSpec) on import.

What lives here: `<op>.py` holds everything the harness knows about an op -- its spec (the
module docstring: semantics, layouts, dtypes, accumulation rules), the numpy oracle (explicit
float64 formulas, readable as the spec), the JAX oracle (jax.vjp of the forward, an independent
derivation), shapes, the input generator, the error and cost models, the argument rule every
implementation's entry runs (`check_args`), and flags such as `row_separable`.  Helpers that
are not ops: broadcast, conv_common, jax_setup (every use of JAX imports it from there), passes
(where an oracle's float64 passes run: the host, or the GPU for the cases the harness hands over).

What may be touched: add an op by adding `<op>.py` here and `cases/<op>.py` (README "Adding an
op"); nothing in harness/ names an op.  Change an existing oracle only with its cross-checks
(tests/test_oracles.py, the fuzz oracle agreement).  Ops from installed packages come through
the `gradoracle.ops` entry points instead (harness.registry.load_ops).
"""
import importlib
import pkgutil

HELPERS = {"broadcast", "conv_common", "jax_setup", "passes"}

for _m in pkgutil.iter_modules(__path__):
    if _m.name not in HELPERS and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")
