"""`python -m harness describe OP` (harness/describe.py): every registered op's contract, printed from its
one declaration (OpSpec, its conventions, its error and cost models, its docstring)."""
import numpy as np
import pytest

from harness import describe
from harness.cli import main
from harness.registry import load_ops


@pytest.mark.parametrize("op", sorted(load_ops()))
def test_every_op_prints_its_contract(op, capsys):
    spec = load_ops()[op]
    assert spec.conventions, f"{op}: declare its conventions in its OpSpec"
    assert main(["describe", op]) == 0
    text = capsys.readouterr().out
    for title in ("Inputs:", "Outputs:", "Params:", "Conventions of this op:", "Conventions of every op",
                  "Tolerance model:", "Cost model", "Spec (the docstring of oracle."):
        assert title in text, title
    for name in spec.inputs + spec.outputs:
        assert f"\n  {name}: " in text
    for key in spec.params:
        assert f"\n  {key}: " in text
    flat = " ".join(text.split())
    for c in spec.conventions:
        assert c in flat
    assert "tol_i = u_out*|r_i| + 8*(u_in + u_acc*sqrt(n))*s_i" in flat and "argcheck.register" in flat
    assert "deterministic=True" in flat and "never alias" in flat and "pre-filled with NaN" in flat
    assert "not documented" not in text  # each op's cost model is in its cost function or its docstring


def test_the_conventions_backend_authors_asked_for(capsys):
    main(["describe", "attention_backward", "--brief"])
    attn = " ".join(capsys.readouterr().out.split())
    assert "natural log" in attn and "layout (B, S, H, D)" in attn and "lse: shape (" in attn
    assert "float32 (float64 in f64 cases): a saved forward statistic" in attn and "Spec (" not in attn
    main(["describe", "layernorm_backward"])
    ln = " ".join(capsys.readouterr().out.split())
    assert "mean and rstd inputs are float32" in ln and "dy: shape (3, 5); the case dtype; layout param dy_layout" in ln


def test_unknown_op_is_a_clear_error():
    with pytest.raises(SystemExit, match="unknown op 'nosuch_backward': registered ops are .*attention_backward"):
        main(["describe", "nosuch_backward"])


def test_an_op_with_only_the_required_fields():
    from harness.registry import OPS, Cost, OpSpec, register_op
    from harness.tensors import from_values

    def shapes(case):
        s = tuple(case.params["shape"])
        return {"x": s, "dy": s, "dx": s}

    register_op(OpSpec(
        name="bare_describe", doc="bare_describe: dx = dy * x", inputs=("x", "dy"), outputs=("dx",),
        params={"shape": "shape"}, shapes=shapes,
        generate=lambda case, rng: {k: from_values(rng.uniform(1, 2, shapes(case)["x"]), case.dtype) for k in "x"},
        numpy_oracle=lambda i, p: {"dx": i["x"] * i["dy"]}, jax_vjp=lambda i, p: {"dx": i["x"] * i["dy"]},
        error_scale=lambda i, p: {"dx": (np.abs(i["x"] * i["dy"]), 1)}, cost=lambda case: Cost(0, 0),
        case_id=lambda case: "bare"))
    try:
        text = describe.describe("bare_describe")
    finally:
        del OPS["bare_describe"]
    assert text.startswith("bare_describe: dx = dy * x") and "Example shapes: none (no cases)" in text
    assert "  x: absent in the example case; the case dtype" in text and "(none declared: see the docstring)" in text


def test_readme_backend_section_points_to_describe_and_argcheck():
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    section = readme.split("## Adding a kernel to a backend", 1)[1].split("\n## ", 1)[0]
    assert "python -m harness describe <op>" in section and "harness.argcheck.register" in section
