"""`python -m harness describe OP`: the contract an implementation of OP must meet, printed from the
op's one declaration (its OpSpec in oracle/<op>.py, or an installed op package's) -- what a
backend author needs before writing a kernel:

  inputs and outputs with example shapes (from the op's first smoke case), dtypes and layouts;
  params; conventions (the op's `OpSpec.conventions`, then the calling convention every op
  shares, from harness/registry.py `Backend.impl`); the tolerance model (harness/compare.py's
  bound with the op's error model: its `error_scale` docstring); the cost model (its `cost`
  docstring, what bench's GB/s and TFLOP/s count); and the op's docstring, the spec itself.
"""
from __future__ import annotations

import inspect
import textwrap

from harness.registry import get_op

# The calling convention of every op (harness/registry.py Backend.impl, harness/runner.py): what the
# harness does to each call, so what every implementation must tolerate or honour.
CALLING = (
    "fn(inputs, outs, params): inputs {name: array on the device}, possibly non-contiguous views "
    "(the case's *_layout params); never write them (a guard checks)",
    "outs {name: contiguous array of the output's shape and dtype, pre-filled with NaN}: write every element "
    "(overwrite, never accumulate) and return None; a functional framework (JAX) may return {name: array}",
    "outputs never alias the inputs or each other: each is its own allocation",
    "deterministic=True is Backend.impl's default: two calls on the same inputs must be bitwise equal; "
    "declare deterministic=False if they are not (the run-to-run spread is then reported)",
    "saved forward statistics (OpSpec.stats) come in float32 (float64 in f64 cases), not the case dtype",
    "every call gets fresh inputs: no caching of results keyed on addresses or shapes (the timed "
    "re-validation refills the inputs in place and fails a stale output)",
    "bad arguments raise ValueError naming op, argument, expected and got: wrap the entry with "
    "harness.argcheck.register, which runs the op's argument rule and exposes fn.unchecked for timing",
)
TOLERANCE = ("per output element, tol_i = u_out*|r_i| + 8*(u_in + u_acc*sqrt(n))*s_i + tiny(dtype) "
             "(harness/compare.py): r_i the float64 oracle on the exact rounded inputs, u_out/u_in the unit "
             "roundoff of the output/input dtype, u_acc float32's (float64's for f64 cases), s_i the L2 norm of "
             "the terms the element sums and n their count, from the op's error model; NaN where the oracle is "
             "finite fails; inf must match")


def add_parser(sub) -> None:
    d = sub.add_parser("describe", help="print an op's contract: inputs/outputs, dtypes, layouts, params, "
                                        "conventions, tolerance and cost models")
    d.add_argument("op", help="op name (python -m harness list shows them)")
    d.add_argument("--brief", action="store_true", help="leave out the op's docstring (the spec's derivations)")


def example_case(op: str):
    """The op's first smoke case (else its first case), or None if it registers none."""
    from cases import all_cases

    mine = [c for c in all_cases() if c.op == op]
    return next((c for c in mine if "smoke" in c.tags), mine[0] if mine else None)


def paragraph(doc: str | None, heading: str) -> str:
    """The first paragraph of `doc` that starts with `heading` (e.g. "Error model", "Cost"), on one line."""
    for para in inspect.cleandoc(doc or "").split("\n\n"):
        if para.lstrip().startswith(heading):
            return " ".join(para.split())
    return ""


def _wrap(text: str, indent: str = "  ") -> list:
    return textwrap.wrap(text, 100, initial_indent=indent, subsequent_indent=indent + "  ")


def describe(op: str, brief: bool = False) -> str:
    """The contract of `op` as text (see the module docstring)."""
    spec = get_op(op)
    case = example_case(op)
    shapes = spec.shapes(case) if case is not None else {}
    first = (spec.doc or "").strip().splitlines()[0] if (spec.doc or "").strip() else op
    lines = [first if first.startswith(op) else f"{op}: {first}", ""]
    lines.append(f"Example shapes: case {case.id}" if case is not None else "Example shapes: none (no cases)")
    layouts = sorted(k for k in spec.params for k in k.split(" / ") if k.endswith("_layout"))
    for title, names in (("Inputs", spec.inputs), ("Outputs", spec.outputs)):
        lines.append(f"{title}:")
        for name in names:
            dtype = "float32 (float64 in f64 cases): a saved forward statistic" if name in spec.stats \
                else "the case dtype"
            shape = f"shape {tuple(shapes[name])}" if name in shapes else "absent in the example case"
            where = "contiguous, NaN-poisoned before the call" if title == "Outputs" else \
                ("layout param " + ", ".join(l for l in layouts if l.startswith(name + "_"))
                 if any(l.startswith(name + "_") for l in layouts) else "no layout param: contiguous")
            lines.append(f"  {name}: {shape}; {dtype}; {where}")
    if spec.wrt:
        lines.append("  derivative of: " + ", ".join(f"{o} = d loss / d {i}" for o, i in spec.wrt.items()))
    if spec.io_names is not None:
        lines.append("  which inputs and outputs exist depends on the params (see below)")
    lines += ["Params:"] + [f"  {k}: {v}" for k, v in spec.params.items()]
    lines.append("Conventions of this op:")
    lines += [w for c in spec.conventions for w in _wrap("- " + c)] or ["  (none declared: see the docstring)"]
    lines.append("Conventions of every op (harness/registry.py Backend.impl):")
    lines += [w for c in CALLING for w in _wrap("- " + c)]
    lines.append("Tolerance model:")
    lines += _wrap(TOLERANCE)
    model = [t for t in (inspect.getdoc(spec.error_scale), paragraph(spec.doc, "Error model")) if t]
    lines += _wrap("this op's error model (s_i, n): " + (" ".join(" ".join(model).split()) if model
                                                        else "(not documented)"))
    if spec.exact_set is not None:
        lines += _wrap("exact-arithmetic input set (harness/exact.py): every case also runs on a dyadic grid "
                       "on which the outputs it names are exact; those are judged to half an ulp of the output dtype")
    lines.append("Cost model (bench's GB/s and TFLOP/s):")
    cost = inspect.getdoc(spec.cost) or paragraph(spec.doc, "Cost")
    lines += _wrap(" ".join(cost.split()) if cost else "(not documented)")
    if not brief and spec.doc:
        module = inspect.getmodule(spec.shapes)
        lines += ["", f"Spec (the docstring of {module.__name__ if module else op}):", ""]
        lines += ["  " + line if line else "" for line in inspect.cleandoc(spec.doc).splitlines()]
    return "\n".join(lines) + "\n"


def cmd_describe(args) -> int:
    try:
        text = describe(args.op, args.brief)
    except KeyError as exc:
        raise SystemExit(f"error: {exc.args[0]}") from None
    print(text, end="")
    return 0
