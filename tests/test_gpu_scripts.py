"""The GPU scripts' helpers that decide what the next device call runs and what BENCHMARKS.md says:
scripts/gpu/full_left.py (the full pairs no result has a PASS for), scripts/gpu/tflops_table.py
(TFLOP/s tables, as text or markdown) and scripts/gpu/profile_table.py (ncu profiles as a table)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts" / "gpu"))

import full_left  # noqa: E402
import profile_table  # noqa: E402
import tflops_table  # noqa: E402

from harness.selection import select  # noqa: E402


def test_full_left_lists_the_pairs_without_a_pass(tmp_path, capsys):
    pairs = [(c, i.id) for c, impls in select("smoke", ["reduce_sum"], None, ["torch"]) for i in impls]
    assert len(pairs) > 4
    (c0, i0), (c1, i1), (c2, i2) = pairs[:3]
    run = tmp_path / "run.json"  # a run JSON: one PASS, one FAIL (not a pass), other ops' rows ignored
    run.write_text(json.dumps({"results": [
        {"op": c0.op, "impl": i0, "case": c0.id, "status": "PASS"},
        {"op": c1.op, "impl": i1, "case": c1.id, "status": "FAIL"},
        {"op": "binary_backward", "impl": i0, "case": c0.id, "status": "PASS"}]}))
    log = tmp_path / "shard.log"  # a run log: its PASS lines
    log.write_text(f"PASS   {c2.op}  {i2}  {c2.id}  0.01  1e-7\nFAIL   {c1.op}  {i1}  {c1.id}\n")
    out = tmp_path / "left.json"
    full_left.main(["--op", "reduce_sum", "--backend", "torch", "--cases", "smoke", "--out", str(out),
                    str(run), str(log)])
    printed = capsys.readouterr().out
    assert f"torch: 2/{len(pairs)} PASS" in printed
    left = [c["params"] for c in json.loads(out.read_text())["cases"]]
    assert len(left) == len(pairs) - 2
    assert c1.to_json()["params"] in left and c0.to_json()["params"] not in left and c2.to_json()["params"] not in left


def _bench_doc(tmp_path) -> str:
    rows = [{"case": "mm[a]", "impl": "x", "status": "PASS", "timing": {"median": 2.0, "host_ms": 0.1},
             "figures": {"tflops": 100.0}},
            {"case": "mm[a]", "impl": "y", "status": "PASS", "timing": {"median": 1.0, "host_ms": 3.0},
             "figures": {"tflops": 200.0}},
            {"case": "mm[b]", "impl": "x", "status": "FAIL", "timing": {}, "figures": {}},
            {"case": "mm[c]", "impl": "x", "status": "PASS", "timing": {"median": 1.0, "throttled_all": True,
                                                                   "clocks": {"median_mhz": 1635.0}},
             "figures": {"tflops": 50.0}}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"rows": rows}))
    return str(path)


def test_tflops_table_markdown(tmp_path):
    lines = tflops_table.table(_bench_doc(tmp_path), ["x", "y"], ["x/y"], host="y", markdown=True)
    assert lines[0] == "| case | x | y | x/y | host > device |"
    assert lines[2] == "| mm[a] | 100.0 | 200.0 | 0.50 | yes |"  # y's host 3.0 ms over its 1.0 ms
    assert lines[3] == "| mm[b] | FAIL | - | - | - |"
    assert lines[4] == "| mm[c] | 50.0 (throttled) | - | - | - |"


def test_tflops_table_text(tmp_path):
    lines = tflops_table.table(_bench_doc(tmp_path), ["x", "y"], ["y/x"], host="x")
    assert "2.00" in lines[1] and "host>device" not in lines[1]
    assert "FAIL" in lines[2] and "throttled" not in lines[1] + lines[2]
    assert lines[3].endswith("throttled: x")


def test_profile_table_one_row_per_kernel(tmp_path):
    case = {"op": "reduce_sum", "dtype": "f32", "params": {"shape": [4096, 4096], "axes": [1]}}
    k0 = {"name": "void rs_rows<float, 4>(RSParams, const T1 *, T1 *)", "duration_ns": 12345.0,
          "tensor_pipe_pct": 0.0, "occupancy_achieved_pct": 40.0, "occupancy_theoretical_pct": 50.0,
          "registers_per_thread": 32.0, "grid_size": 264.0, "block_size": 256.0, "waves_per_sm": 1.0,
          "tail_wave_fill": 1.0, "smem_bank_conflicts_ld": 3.0, "smem_bank_conflicts_st": 0.0,
          "ld_sectors_per_request": 4.0, "st_sectors_per_request": 2.0, "dram_gbps": 2500.0,
          "top_stalls": [{"reason": "long_scoreboard", "pct": 60.4}, {"reason": "wait", "pct": 10.0},
                         {"reason": "selected", "pct": 5.0}]}
    k1 = {"name": "_finish_kernel", "duration_ns": None}  # a kernel ncu gave no figures for
    path = tmp_path / "p.json"
    path.write_text(json.dumps({"op": "reduce_sum", "impl": "cupy@best", "case": json.dumps(case),
                                "kernels": [k0, k1]}))
    lines = profile_table.table([str(path)])
    assert len(lines) == 4 and lines[0].startswith("| case | impl | kernel |")
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[0] == "sum[f32,X=4096x4096,axes=(1)]"  # the registry's case id
    assert cells[1:4] == ["cupy@best", "`rs_rows<float, 4>`", "12.3"]
    assert cells[7] == "264 x 256 (1.00, 100%)" and cells[-1] == "long_scoreboard 60%, wait 10%"
    row2 = [c.strip() for c in lines[3].strip("|").split("|")]
    assert row2[:3] == ["", "", "`_finish_kernel`"] and row2[3] == "-"


# The next device call's inputs (scripts/gpu/batch_s14.sh): its case file loads through the registry,
# and each line of its profile list names a registered implementation of the op and a case the
# registry accepts, so the call does not spend device time on a typo.
NEXT_CASES = ("pertap_left_s14.json",)
NEXT_PROFILES = ("profile_s14.txt", "profile_s15.txt")


def test_the_next_calls_case_files_load():
    from cases.registry import load_file

    for name in NEXT_CASES:
        cases = load_file(ROOT / "scripts" / "gpu" / "cases" / name)
        assert cases and all(c.tags and "full" in c.tags for c in cases), name


def test_the_next_calls_profile_lists_name_real_impls_and_cases():
    from cases.registry import from_json
    from harness.registry import find_impl

    for name in NEXT_PROFILES:
        lines = [ln for ln in (ROOT / "scripts" / "gpu" / "cases" / name).read_text().splitlines()
                 if ln.strip() and not ln.startswith("#")]
        assert lines, name
        for line in lines:
            op, impl, case = line.split(None, 2)
            c = from_json(json.loads(case), name)
            assert c.op == op, line
            find_impl(op, impl)  # raises on an unknown implementation
