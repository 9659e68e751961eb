"""Case registry: every (op, dtype, params) the harness checks, and each op's fuzz strategy.

What lives here: `registry.py` (Case, add, select by tag/file/JSON, the @strategy decorator)
and one module per op, `<op>.py` (a module may serve several ops: conv_backward.py serves both
convolutions), which adds the op's cases (tags smoke, full, perf, stress) and registers its
hypothesis strategy.  Every module here is imported by `registry.all_cases()`.

What may be touched: add cases to an op's module, or a module for a new op (README "Adding an
op"); keep case ids stable (results and repro lines name them).  Cases of an op installed from
a package live in the module its OpSpec names as `cases_module`.
"""
from cases.registry import TAGS, Case, CaseFileError, add, all_cases, load_file, select

__all__ = ["TAGS", "Case", "CaseFileError", "add", "all_cases", "load_file", "select"]
