"""Checking a split run (harness/multi_gpu/check.py): `python -m harness.multi_gpu compare` on synthetic
results, `compare-junit` on synthetic junit files, and the "GPU per worker" lines of `pytest -n N`."""
import gzip
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.multi_gpu.check import compare_junit, compare_runs, format_comparison, read_junit, row_key
from harness.multi_gpu.cli import main as multi_gpu_main
from harness.multi_gpu.xdist import pin_summary_lines, worker_gpu_info

ROOT = Path(__file__).resolve().parents[1]


def _row(op, impl, case, status="PASS", rel=0.0, **extra):
    return {"op": op, "impl": impl, "case": case, "dtype": "f32", "status": status,
            "outputs": [{"name": "grad_a", "passed": status == "PASS", "max_rel": rel, "worst_ratio": rel}], **extra}


def _runs(n_cases=6, gpus=("0", "1")):
    """A single run and its --gpus split: case i went to worker i mod len(gpus), as --shard does."""
    rows = [_row(op, impl, f"c{i}") for op in ("binary_backward", "reduce_sum") for i in range(n_cases)
            for impl in (("cupy@opt", "torch") if op == "binary_backward" else ("torch",))]
    one = {"device": "cuda", "seed": 7, "interrupted": None, "results": rows}
    split = [{**r, "gpu": gpus[int(r["case"][1:]) % len(gpus)], "worker": int(r["case"][1:]) % len(gpus)} for r in rows]
    two = {"device": "cuda", "seed": 7, "interrupted": None, "gpus": len(gpus), "results": split,
           "workers": [{"worker": k, "gpu": g, "exit_code": 0} for k, g in enumerate(gpus)]}
    return one, two


def test_identical_runs_spread_over_both_gpus_are_ok():
    one, two = _runs()
    c = compare_runs(one, two, wall_one=100.0, wall_two=40.0)
    assert c["ok"] and c["identical"] and c["split"] and not c["incomplete"]
    assert c["rows_one"] == c["rows_two"] == c["common"] == 18 and c["same_error_figures"] == 18
    assert c["per_gpu"] == {"0": {"rows": 9, "cases": 6}, "1": {"rows": 9, "cases": 6}}
    assert c["per_worker"] == {"0": {"rows": 9, "cases": 6}, "1": {"rows": 9, "cases": 6}}
    assert c["gpus_used"] == ["0", "1"] and c["speedup"] == pytest.approx(2.5)
    text = format_comparison(c)
    assert "verdicts identical: yes" in text and "speedup 2.50x" in text and text.endswith("verdict: OK")
    assert "per gpu: 0: 9 rows, 6 cases; 1: 9 rows, 6 cases" in text


def test_a_different_status_a_missing_and_a_doubled_row_are_listed():
    one, two = _runs()
    two["results"][3] = {**two["results"][3], "status": "FAIL"}
    lost = two["results"].pop(5)
    two["results"].append(dict(two["results"][0]))
    c = compare_runs(one, two)
    assert not c["ok"] and not c["identical"] and c["split"]
    assert c["status_differs"] == [[*row_key(one["results"][3]), "PASS", "FAIL"]]
    assert c["only_in_one"] == [list(row_key(lost))] and c["only_in_two"] == []
    assert c["duplicates_two"] == [list(row_key(one["results"][0]))] and c["duplicates_one"] == []
    text = format_comparison(c)
    assert "verdicts identical: NO (1 status differences, 1 rows only in one, 0 only in two, 1 duplicated)" in text
    assert "status differs: binary_backward | torch | c1 | f32 | PASS | FAIL" in text
    assert text.endswith("verdict: NOT OK") and c["speedup"] is None


def test_changed_error_figures_alone_keep_the_verdicts_identical():
    one, two = _runs()
    two["results"][0] = {**two["results"][0], "outputs": [{"name": "grad_a", "passed": True, "max_rel": 1e-7,
                                                           "worst_ratio": 0.1}]}
    c = compare_runs(one, two)
    assert c["ok"] and c["same_error_figures"] == c["common"] - 1


def test_a_run_on_one_gpu_only_or_an_interrupted_run_is_not_ok():
    one, two = _runs()
    for r in two["results"]:
        r["gpu"], r["worker"] = "0", 0
    c = compare_runs(one, two)
    assert c["identical"] and not c["split"] and not c["ok"] and c["gpus_used"] == ["0"]
    one, two = _runs()
    two["results"] = [{**r, "gpu": "0"} for r in two["results"]]  # two workers, yet one GPU
    assert not compare_runs(one, two)["split"]
    one, two = _runs()
    one["interrupted"] = "interrupted after 17 results"
    two["workers"][1]["exit_code"] = -9
    c = compare_runs(one, two)
    assert c["identical"] and not c["ok"]
    assert c["incomplete"] == ["one: interrupted after 17 results", "two: worker 1 exit status -9"]
    assert "INCOMPLETE one: interrupted after 17 results" in format_comparison(c)
    two["workers"][1]["exit_code"] = 0  # the single run cut short, the split one complete: a lower bound
    assert "speedup at least 3.00x" in format_comparison(compare_runs(one, two, wall_one=300.0, wall_two=100.0))


def test_cpu_workers_count_by_worker():
    one, two = _runs(gpus=(None, None))
    one["device"] = two["device"] = "cpu"
    c = compare_runs(one, two)
    assert c["ok"] and c["gpus_used"] == [] and c["per_gpu"] == {"none": {"rows": 18, "cases": 12}}


def test_the_compare_command_reads_gz_writes_json_and_exits_by_the_verdict(tmp_path, capsys):
    one, two = _runs()
    (tmp_path / "one.json.gz").write_bytes(gzip.compress(json.dumps(one).encode()))
    (tmp_path / "two.json").write_text(json.dumps(two))
    argv = ["compare", str(tmp_path / "one.json.gz"), str(tmp_path / "two.json"), "--wall-one", "90",
            "--wall-two", "50", "--json", str(tmp_path / "c.json")]
    assert multi_gpu_main(argv) == 0
    assert "wall: one 90.0s, two 50.0s, speedup 1.80x" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["per_gpu"]["1"]["rows"] == 9
    two["results"][0]["status"] = "ERROR"
    (tmp_path / "two.json").write_text(json.dumps(two))
    assert multi_gpu_main(argv) == 1


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_x[1]" time="0.1"/>
<testcase classname="tests.test_a" name="test_x[2]" time="0.1"><skipped message="no GPU"/></testcase>
<testcase classname="tests.test_a" name="test_y" time="0.1">{y}</testcase>
</testsuite></testsuites>"""


def test_compare_junit_test_by_test(tmp_path, capsys):
    (tmp_path / "a.xml").write_text(JUNIT.format(y=""))
    (tmp_path / "b.xml").write_text(JUNIT.format(y='<failure message="boom"/>'))
    a, b = read_junit(tmp_path / "a.xml"), read_junit(tmp_path / "b.xml")
    assert a == {"tests.test_a::test_x[1]": "passed", "tests.test_a::test_x[2]": "skipped",
                 "tests.test_a::test_y": "passed"}
    c = compare_junit(a, b)
    assert not c["same"] and c["differ"] == [["tests.test_a::test_y", "passed", "failed"]]
    assert c["counts_b"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 1}
    assert multi_gpu_main(["compare-junit", str(tmp_path / "a.xml"), str(tmp_path / "a.xml")]) == 0
    assert multi_gpu_main(["compare-junit", str(tmp_path / "a.xml"), str(tmp_path / "b.xml")]) == 1
    assert "same outcome for every test: NO (1 differ)" in capsys.readouterr().out


def test_pin_summary_lines():
    workers = {
        "gw1": {"worker": "gw1", "pinned": "1", "of": 2, "cuda_visible_devices": "1", "torch_devices": 1,
                "name": "NVIDIA H200", "uuid": "GPU-b", "outcomes": {"passed": 5, "skipped": 1}},
        "gw0": {"worker": "gw0", "pinned": "0", "of": 2, "cuda_visible_devices": "0", "outcomes": {"passed": 4}},
        "gw10": {"worker": "gw10", "pinned": None, "of": None, "cuda_visible_devices": None, "outcomes": {}},
    }
    assert pin_summary_lines(workers) == [
        "gw0: GPU 0 (of 2 visible) (CUDA_VISIBLE_DEVICES=0); 4 tests: 4 passed",
        "gw1: GPU 1 (of 2 visible) (CUDA_VISIBLE_DEVICES=1), torch sees 1: NVIDIA H200 uuid GPU-b; "
        "6 tests: 5 passed, 1 skipped",
        "gw10: no GPU pinned (CUDA_VISIBLE_DEVICES=None); 0 tests: ",
        "3 workers on 2 distinct GPU(s)"]
    info = worker_gpu_info({"PYTEST_XDIST_WORKER": "gw3", "CUDA_VISIBLE_DEVICES": "3"})
    assert info["worker"] == "gw3" and info["cuda_visible_devices"] == "3"


def test_pytest_n_prints_the_gpu_of_each_worker():
    """Two workers pinned from CUDA_VISIBLE_DEVICES=3,5 (no CUDA needed): the controller lists both."""
    pytest.importorskip("xdist")
    # a controller, not a worker: drop what an outer xdist worker (pytest -n N of this file) exports
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    env["CUDA_VISIBLE_DEVICES"] = "3,5"
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                          "tests/test_multi_gpu_verify.py", "-k", "compare_junit or pin_summary or cpu_workers"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "gradoracle: GPU per worker" in out.stdout
    assert "gw0: GPU 3 (of 2 visible) (CUDA_VISIBLE_DEVICES=3)" in out.stdout
    assert "gw1: GPU 5 (of 2 visible) (CUDA_VISIBLE_DEVICES=5)" in out.stdout
    assert "2 workers on 2 distinct GPU(s)" in out.stdout and "3 passed" in out.stdout
