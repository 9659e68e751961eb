"""The case registry: ids, required shapes, tags, and cases loaded from files."""
import json
from collections import Counter

import pytest

from cases import load_file, select
from cases.binary_backward import SEED_B, masked
from cases.registry import from_json


def test_ids_are_unique_and_readable():
    ids = Counter((c.op, c.id) for c in select("all"))
    assert not [k for k, n in ids.items() if n > 1]
    assert "mul[f32,A=2x3x4x5,B=1x1x4x5]" in {c.id for c in select("smoke")}


def test_seed_compare_shapes_are_in_smoke_verbatim():
    smoke = {c.id for c in select("smoke")}
    for b in SEED_B:
        assert f"mul[f32,A=2x3x4x5,B={'x'.join(map(str, b))}]" in smoke


def test_every_broadcast_mask_of_a_b_and_both():
    full = {(tuple(c.params["a"]), tuple(c.params["b"])) for c in select("full", op="binary_backward")
            if c.params["fn"] == "mul"}
    r4 = (2, 3, 4, 5)
    for ma in range(16):
        assert (r4, masked(r4, ma)) in full and (masked(r4, ma), r4) in full
        for mb in range(16):
            assert (masked(r4, ma), masked(r4, mb)) in full


def test_required_kinds_of_case_exist():
    full = select("full", op="binary_backward")
    shapes = {(tuple(c.params["a"]), tuple(c.params["b"])) for c in full}
    assert ((3, 1, 5), (1, 4, 5)) in shapes  # both broadcast
    assert ((), (3, 4)) in shapes and ((2, 3, 4, 5), (5,)) in shapes  # scalar, rank mismatch
    assert any(0 in a or 0 in b for a, b in shapes)  # empty dims
    for b in [(4096,), (8, 1, 4096), (8, 2048, 1)]:  # llama-style training shapes
        assert ((8, 2048, 4096), b) in {(tuple(c.params["a"]), tuple(c.params["b"]))
                                        for c in select("perf", op="binary_backward")}
    layouts = {c.params.get(k) for c in full for k in ("a_layout", "b_layout", "g_layout")}
    assert {"transposed", "sliced"} <= layouts
    assert {c.dtype for c in select("smoke")} == {"f32", "f16", "bf16", "f64"}
    assert all(c.params["a"] and c.params["b"] for c in select("stress", op="binary_backward"))
    from math import prod
    from oracle.binary_backward import broadcast_shape
    assert all(prod(broadcast_shape(c.params["a"], c.params["b"])) > 2**31
               for c in select("stress", op="binary_backward"))


def test_smoke_is_part_of_full():
    assert {id(c) for c in select("smoke")} <= {id(c) for c in select("full")}


@pytest.mark.parametrize("suffix", ["json", "yaml"])
def test_cases_load_from_a_file(tmp_path, suffix):
    cases = [{"op": "binary_backward", "dtype": "bf16", "params": {"fn": "div", "a": [16, 1, 64], "b": [16, 8, 1]}}]
    path = tmp_path / f"mine.{suffix}"
    if suffix == "json":
        path.write_text(json.dumps(cases))
    else:
        import yaml

        path.write_text(yaml.safe_dump({"cases": cases}))
    loaded = load_file(path)
    assert [c.id for c in loaded] == ["div[bf16,A=16x1x64,B=16x8x1]"]
    assert select(str(path))[0].id == loaded[0].id


@pytest.mark.parametrize("bad, words", [
    ({"op": "binary_backward", "params": {"fn": "mul", "a": [2, 3], "b": [4]}}, "do not broadcast"),
    ({"op": "binary_backward", "params": {"fn": "nope", "a": [2], "b": [2]}}, "fn 'nope'"),
    ({"op": "binary_backward", "params": {"fn": "mul", "a": [2]}}, "missing param 'b'"),
    ({"op": "binary_backward", "dtype": "f8", "params": {"fn": "mul", "a": [2], "b": [2]}}, "unknown dtype"),
    ({"op": "nosuchop", "params": {}}, "unknown op"),
    ({"op": "binary_backward", "tags": ["fast"], "params": {"fn": "mul", "a": [2], "b": [2]}}, "unknown tags"),
])
def test_bad_case_files_fail_loudly(bad, words):
    with pytest.raises((ValueError, KeyError), match=words):
        from_json(bad, "test")
