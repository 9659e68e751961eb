"""`harness bench` in a reused worker process (harness/isolate.py, bench.isolated_pair, bench.in_worker).

A bench that selects a kernel under test times every pair in a worker, as `run` does: a host-side
crash becomes that pair's CRASH row (table and JSON), the next pair gets a fresh worker, and the
exit status is non-zero.  The rows are the ones the in-process bench builds, and whether to
isolate is decided by the one function `run` uses (run_report.isolate_by_default).
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import ceilings, run_report
from harness.cli import _parse, main

ROOT = Path(__file__).resolve().parents[1]
TWO_CASES = ('[{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}},'
             '{"op":"binary_backward","dtype":"f32","params":{"fn":"add","a":[4],"b":[1]}}]')
QUICK = ["--device", "cpu", "--mode", "hot", "--budget", "0.02", "--min-samples", "3", "--max-samples", "20",
         "--warmup-budget", "0.02", "--no-loop", "-q", "--no-plots"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """Made-up CPU ceilings in a fresh cache: nothing is measured (the worker inherits the variable)."""
    monkeypatch.setenv("GRADORACLE_CACHE", str(tmp_path / "cache"))
    record = {"schema": ceilings.SCHEMA, "device": ceilings.device_info("cpu"), "copy": {"gbs": 10.0},
              "matmul": {"fp32": {"tflops": 0.1, "name": "fp32"}, "bf16": {"tflops": 0.05, "name": "bf16"}}}
    path = ceilings.cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def bench(*args, env_extra=None):
    env = dict(os.environ, GRADORACLE_BACKENDS="planted_crash",
               PYTHONPATH=os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")]), **(env_extra or {}))
    return subprocess.run([sys.executable, "-m", "harness", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=600, env=env)


def test_a_crash_is_a_crash_row_and_the_bench_goes_on(tmp_path, cache):
    out = bench("--cases", TWO_CASES, "--backend", "planted_crash@correct", "--backend", "planted_crash@segfault",
                "--backend", "planted_crash@sticky", "--backend", "planted_crash@hang", "--case-timeout", "3",
                *QUICK, "--report", str(tmp_path / "r"), env_extra={"GRADORACLE_CACHE": str(tmp_path / "cache")})
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "isolate=worker process" in out.stderr
    res = json.loads((tmp_path / "r" / "results.json").read_text())
    got = [(r["case"], r["impl"], r["status"]) for r in res["rows"]]
    cases = ["mul[f32,A=2x3,B=3]", "add[f32,A=4,B=1]"]
    assert got == [(c, f"planted_crash@{v}", s) for c in cases
                   for v, s in (("correct", "PASS"), ("hang", "TIMEOUT"), ("segfault", "CRASH"), ("sticky", "CRASH"))]
    rows = {(r["case"], r["impl"]): r for r in res["rows"]}
    seg = rows[(cases[0], "planted_crash@segfault")]
    assert "killed by SIGSEGV" in seg["reason"] and "in segfault" in seg["reason"]
    assert seg["crash"]["signal"] == "SIGSEGV" and seg["repro"].endswith(" --time")
    assert seg["backend"] == "planted_crash" and seg["variant"] == "segfault" and seg["cost"]["bytes"] > 0
    assert "cudaErrorIllegalAddress" in rows[(cases[0], "planted_crash@sticky")]["reason"]
    assert "--case-timeout 3" in rows[(cases[1], "planted_crash@hang")]["reason"]
    assert rows[(cases[1], "planted_crash@correct")]["timing"]["n"] >= 3  # timed after the crashes, fresh worker
    assert not res["interrupted"]
    assert "CRASH binary_backward planted_crash@segfault mul[f32,A=2x3,B=3]: the worker process killed by SIGSEGV" \
        in out.stdout
    assert "2 timed, 6 failed (4 crashed, 2 timed out), 0 skipped" in out.stdout


def _rows(path):
    return [(r["op"], r["case"], r["impl"], r["status"]) for r in json.loads(Path(path).read_text())["rows"]]


def test_isolated_and_in_process_benches_give_the_same_rows(tmp_path, cache, capsys):
    sel = ["--cases", "smoke", "--op", "binary_backward", "--dtype", "f32", "--per-op", "2",
           "--backend", "torch", "--backend", "torch_ext", *QUICK]
    assert main(["bench", *sel, "--report", str(tmp_path / "iso")]) == 0
    iso_err = capsys.readouterr().err
    assert main(["bench", *sel, "--no-isolate", "--report", str(tmp_path / "in")]) == 0
    in_err = capsys.readouterr().err
    assert "isolate=worker process" in iso_err and "isolate=" not in in_err
    iso, inp = _rows(tmp_path / "iso" / "results.json"), _rows(tmp_path / "in" / "results.json")
    assert iso == inp and len(iso) == 4 and all(r[3] == "PASS" for r in iso)
    a = json.loads((tmp_path / "iso" / "results.json").read_text())
    b = json.loads((tmp_path / "in" / "results.json").read_text())
    for x, y in zip(a["rows"], b["rows"]):  # the same keys and the same untimed values: only timings differ
        assert set(x) == set(y) and set(x["timing"]) == set(y["timing"]) and set(x["figures"]) == set(y["figures"])
        for key in ("case_json", "cost", "backend", "variant", "baseline", "library", "framework", "repro", "oracle",
                    "footprint_bytes", "variant_rank"):
            assert x[key] == y[key], key
        assert [o["name"] for o in x["outputs"]] == [o["name"] for o in y["outputs"]]
        for r in (x, y):  # where the bench's time went: each phase's wall seconds, and the pair's
            assert {"upload", "wait", "time", "final"} <= set(r["phases_s"]), r["phases_s"]
            assert r["pair_s"] >= r["phases_s"]["time"] > 0
    # the worker waited for (or made) each case's inputs before its first implementation
    assert [("prepare" in r["phases_s"]) for r in a["rows"]] == [True, False, True, False]
    assert a["ceilings"] == b["ceilings"] and set(a) == set(b)


@pytest.mark.parametrize("flags, backends, isolated", [
    ([], ["torch", "torch_ext"], True),   # a kernel under test
    ([], ["torch"], False),               # framework baselines alone
    (["--no-isolate"], ["torch", "torch_ext"], False),
    (["--isolate"], ["torch"], True),
])
def test_bench_decides_isolation_as_run_does(flags, backends, isolated):
    from harness import bench
    from harness.registry import discover

    discover()
    picked = [a for b in backends for a in ("--backend", b)]
    for command in ("bench", "run"):
        args = _parse([command, "--cases", "smoke", "--op", "binary_backward", *picked, *flags])
        pairs = bench.plan("smoke", ["binary_backward"], backends, ["f32"])
        assert run_report.isolate_by_default(args, pairs) is isolated, command


def test_bench_calls_the_shared_decision(tmp_path, cache, capsys, monkeypatch):
    """bench asks run_report.isolate_by_default (no copy of its rule): told no, it times in this process."""
    asked = []

    def decide(args, pairs):
        asked.append((args.command, [i.id for _, impls in pairs for i in impls]))
        return False

    monkeypatch.setattr(run_report, "isolate_by_default", decide)
    assert main(["bench", "--cases", TWO_CASES, "--backend", "torch_ext", *QUICK, "--report", str(tmp_path / "r")]) == 0
    assert asked == [("bench", ["torch_ext", "torch_ext"])]
    assert "isolate=" not in capsys.readouterr().err


def test_the_worker_prepares_the_next_cases_ahead(monkeypatch):
    """bench.in_worker, as a worker runs it: the cases named `upcoming` are prepared in lookahead threads
    while this one is timed, and used (not prepared again) when their turn comes."""
    from cases.registry import from_json
    from harness import bench, timing
    from harness.registry import BACKENDS, discover

    discover()
    prepared = []
    real = bench.case_inputs
    monkeypatch.setattr(bench, "case_inputs", lambda case, *a: prepared.append(case.id) or real(case, *a))
    monkeypatch.setattr(bench, "_WORKER", {})
    first, second = (from_json(c, "test") for c in json.loads(TWO_CASES))
    impl = BACKENDS["torch"].impls[("binary_backward", "default")]
    opts = bench.BenchOptions("cpu", timing.TimingConfig(mode="hot", budget_s=0.01, min_samples=3, loop=False),
                              prefetch=1)
    spec = opts.to_json()
    rows = [bench.in_worker(impl, first, {**spec, "upcoming": [second.to_json()]})()["result"]]
    bench._WORKER["futures"][bench._key(second.to_json(), opts)].result()  # prepared meanwhile
    rows.append(bench.in_worker(impl, from_json(second.to_json(), "again"), {**spec, "upcoming": []})()["result"])
    assert sorted(prepared) == sorted([first.id, second.id])  # each once: the second by the lookahead
    assert [(r["case"], r["status"]) for r in rows] == [(first.id, "PASS"), (second.id, "PASS")]
    assert bench._WORKER["futures"] == {}
