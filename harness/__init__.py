"""gradoracle's harness: registries, the tolerance model, preparation, the runner, timing and the
drivers (CLI, bench, isolate, sanitize, many GPUs, reports).  It names no op: everything about
an op comes from its OpSpec (oracle/) and its case module (cases/).

Layers (tests/test_import_graph.py checks them; a module imports its own layer or below):
  core     registry, status, results, dtypes, tensors, compare, frameworks
  one call argcheck, guards, cuda_errors, prepared, prepare, stress, selection, runner, timing,
           ceilings, fuzz
  drivers  cli, __main__, bench_cli, bench, isolate, sanitize, multi_gpu/, report/

What may be touched: a new driver sits on top and may import anything below it; core modules
import nothing above core.  Per-op knowledge goes into the op's OpSpec (a new field there if
needed), never into a table here.
"""
