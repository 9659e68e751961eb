"""`python -m harness bench` / `compare` / `ceilings` end to end on the CPU, and test_benchmark's collection and
pytest-benchmark round trip (--benchmark-save, --benchmark-compare)."""
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

import conftest as plugin
from harness import ceilings
from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
CASES = [{"op": "binary_backward", "dtype": "f32", "params": {"fn": "mul", "a": [16, 64], "b": [64]}},
         {"op": "binary_backward", "dtype": "f64", "params": {"fn": "div", "a": [8, 1, 32], "b": [1, 4, 32]}}]
FAST = ["--device", "cpu", "--backend", "torch", "--backend", "torch_ext", "--mode", "hot", "--budget", "0.03",
        "--min-samples", "5", "--max-samples", "60", "--warmup-budget", "0.03", "--prefetch", "1", "-q"]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A ceilings cache already holding this CPU's (made-up) ceilings, so nothing is measured."""
    monkeypatch.setenv("GRADORACLE_CACHE", str(tmp_path / "cache"))
    record = {"schema": ceilings.SCHEMA, "device": ceilings.device_info("cpu"), "copy": {"gbs": 10.0},
              "matmul": {"fp32": {"tflops": 0.1, "name": "fp32"}, "bf16": {"tflops": 0.05, "name": "bf16"}}}
    path = ceilings.cache_path("cpu")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record))
    return path


def test_bench_reports_compare_and_benchmarks_md(tmp_path, cache, capsys):
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps(CASES))
    md = tmp_path / "BENCHMARKS.md"
    assert main(["bench", "--cases", str(case_file), *FAST, "--report", str(tmp_path / "one"),
                 "--benchmarks-md", str(md)]) == 0
    out = capsys.readouterr().out
    assert "4 timed, 0 failed, 0 skipped" in out and "wrote " + str(tmp_path / "one" / "report.md") in out
    res = json.loads((tmp_path / "one" / "results.json").read_text())
    assert res["schema"] == "gradoracle-bench/1" and res["command"].startswith("python -m harness bench --cases")
    assert res["ceilings"]["copy"]["gbs"] == 10.0 and res["device"]["kind"] == "cpu"
    rows = res["rows"]
    assert [(r["impl"], r["status"]) for r in rows] == [("torch", "PASS"), ("torch_ext", "PASS")] * 2
    for r in rows:
        t = r["timing"]
        assert t["n"] >= 5 and t["timer"] == "perf_counter" and t["mode"] == "hot" and t["final_ms"] > 0
        assert t["ci_lo"] <= t["median"] <= t["ci_hi"] and len(t["samples_ms"]) == t["n"]
        assert r["figures"]["gbs"] > 0 and "pct_copy" in r["figures"] and r["outputs"][0]["passed"]
        assert t["loop_ms"] > 0 and t["loop_calls"] >= 10 and "host_bound" in r["figures"]  # the loop figure
        assert t["peak_extra_bytes"] is None and t["peak_note"] == "not measured on the CPU"
        assert r["figures"]["binding"] in ("copy", "matmul") and r["figures"]["pct_binding"] > 0
    assert rows[1]["figures"]["speedup_vs_baseline"] > 0 and rows[1]["figures"]["baseline"] == "torch"
    assert (tmp_path / "one" / "plots" / "roofline_binary_backward.png").exists()
    assert "| case | impl | status | time (ms)" in (tmp_path / "one" / "report.md").read_text()
    assert "## binary_backward" in md.read_text()
    assert "| case | bytes | impl | time (ms) | loop (ms) | binding ceiling | peak mem | vs torch |" in md.read_text()

    assert main(["bench", "--cases", str(case_file), *FAST, "--report", str(tmp_path / "two"), "--no-plots",
                 "--loop-calls", "12"]) == 0
    capsys.readouterr()
    assert {r["timing"]["loop_calls"] for r in json.loads((tmp_path / "two" / "results.json").read_text())["rows"]} \
        == {12}
    assert main(["compare", str(tmp_path / "one" / "results.json"), str(tmp_path / "two" / "results.json"),
                 "--all", "--json", str(tmp_path / "cmp.json")]) == 0
    text = capsys.readouterr().out
    assert "summary: 4 timed in both" in text and "medians within 2%:" in text
    verdicts = [r["verdict"] for r in json.loads((tmp_path / "cmp.json").read_text())["rows"]]
    assert len(verdicts) == 4 and set(verdicts) <= {"FASTER", "SLOWER", "SAME", "AMBIGUOUS"}

    md.write_text("hand-written intro\n\n" + md.read_text())
    assert main(["bench", "--from", str(tmp_path / "two" / "results.json"), "--benchmarks-md", str(md)]) == 0
    assert md.read_text().startswith("hand-written intro") and md.read_text().count("<!-- gradoracle:benchmarks begin")


def test_bench_exits_nonzero_on_a_revalidation_failure(tmp_path, cache, capsys):
    code = ("import sys; sys.path.insert(0, 'tests'); import planted; planted.planted.register = True; "
            "from harness.registry import register_backend; register_backend(planted.planted); "
            "from harness.cli import main; sys.exit(main(sys.argv[1:]))")
    case = json.dumps(CASES[0])
    out = subprocess.run([sys.executable, "-c", code, "bench", "--cases", case, "--device", "cpu", "--backend",
                          "torch", "--backend", "planted@stale_cache", "--mode", "hot", "--budget", "0.02",
                          "--min-samples", "3", "--report", str(tmp_path / "r"), "--no-plots"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600, env=os.environ.copy())
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL binary_backward planted@stale_cache mul[f32,A=16x64,B=64]: timed re-validation" in out.stdout
    assert "a cached result" in out.stdout
    assert "reproduce: python -m harness run --op binary_backward --backend planted@stale_cache" in out.stdout
    assert "1 timed, 1 failed" in out.stdout
    assert "[" in out.stderr and "2/2 100%" in out.stderr  # the progress bar, on stderr
    rows = json.loads((tmp_path / "r" / "results.json").read_text())["rows"]
    assert rows[1]["status"] == "FAIL" and rows[1]["timing"]["n"] >= 3


def test_ceilings_command(cache, capsys):
    assert main(["ceilings", "--device", "cpu"]) == 0
    text = capsys.readouterr().out
    assert "copy 10 GB/s (read+write" in text and str(cache) in text


def test_bench_needs_somewhere_to_write():
    with pytest.raises(SystemExit, match="--report"):
        main(["bench", "--device", "cpu", "--cases", "smoke"])


# ----------------------------------------------------------------------------- test_benchmark collection


def _config(**options):
    values = {"--op": None, "--backend": None, "--dtype": None, "--device": "cpu", "--cases": None}
    values.update({k: v for k, v in options.items() if k.startswith("--")})
    option = types.SimpleNamespace(bench=options.get("bench", False), benchmark_only=options.get("only", False),
                                   benchmark_enable=False)
    return types.SimpleNamespace(option=option, getoption=lambda name: values[name])


def test_benchmark_collection_smoke_by_default_and_perf_when_asked():
    smoke = plugin.benchmark_params(_config())
    ids = [p.id for p in smoke]
    ops = {p.values[0] for p in smoke}
    per_op = {op: {p.values[2].id for p in smoke if p.values[0] == op} for op in ops}
    assert all(len(c) == 1 for c in per_op.values())  # one small smoke case per op
    assert "binary_backward" in ops and any(i.startswith("binary_backward-torch-") for i in ids)
    assert not any(m.name == "slow" for p in smoke for m in p.marks)

    asked = plugin.benchmark_params(_config(bench=True, **{"--op": ["binary_backward"], "--backend": ["torch"]}))
    assert asked and all("perf" in p.values[2].tags for p in asked)
    assert all(p.id.startswith("binary_backward-torch-") for p in asked)
    assert all(any(m.name == "slow" for m in p.marks) for p in asked)
    only = plugin.benchmark_params(_config(only=True, **{"--cases": "smoke", "--dtype": ["f64"],
                                                         "--op": ["binary_backward"]}))
    assert len(only) > len(per_op["binary_backward"]) and all(p.values[2].dtype == "f64" for p in only)


def test_pytest_benchmark_save_and_compare(tmp_path, cache):
    storage = tmp_path / "store"
    args = [sys.executable, "-m", "pytest", "tests/test_benchmark.py", "-p", "no:cacheprovider", "-q",
            "--op", "binary_backward", "--backend", "torch", "--backend", "torch_ext",
            f"--benchmark-storage=file://{storage}"]
    # Drop xdist worker variables: under `pytest -n` the inner pytest must not think it is a worker.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["GRADORACLE_CACHE"] = str(cache.parent)
    first = subprocess.run(args + ["--benchmark-save=one", f"--benchmark-json={tmp_path / 'b.json'}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=600, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    data = json.loads((tmp_path / "b.json").read_text())
    names = {b["name"] for b in data["benchmarks"]}
    assert any(n.startswith("test_benchmark[binary_backward-torch-") for n in names)
    assert any(n.startswith("test_benchmark[binary_backward-torch_ext-") for n in names)
    b = next(b for b in data["benchmarks"] if "torch_ext" in b["name"])
    assert b["group"] == b["param"].split("-", 2)[2] and b["options"]["timer"] == "gradoracle.timing-replay"
    assert b["extra_info"]["speedup_vs_baseline"] > 0 and b["extra_info"]["gbs"] > 0
    assert b["extra_info"]["pct_copy"] > 0 and b["extra_info"]["timer"] == "perf_counter"
    assert b["stats"]["rounds"] == b["extra_info"]["samples"]
    assert b["stats"]["median"] == pytest.approx(b["extra_info"]["median_ms"] * 1e-3, rel=1e-3)
    second = subprocess.run(args + ["--benchmark-compare=0001"], cwd=ROOT, capture_output=True, text=True,
                            timeout=600, env=env)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "0001_one" in second.stdout + second.stderr


def test_time_limit_records_pairs_not_run_and_interleave_covers_ops(cache):
    from cases import select
    from harness import bench, timing
    from harness.registry import discover

    discover()
    smoke = select("smoke")
    pairs = bench.plan(smoke, None, ["torch"], ["f32"], per_op=2, interleave=True)
    ops = [c.op for c, _ in pairs]
    assert len(set(ops)) >= 2 and ops[: len(set(ops))] == list(dict.fromkeys(ops))  # one of each op first
    assert all(ops.count(op) <= 2 for op in set(ops))
    opts = bench.BenchOptions("cpu", timing.TimingConfig(mode="hot", budget_s=0.01, min_samples=3),
                              time_limit_s=0.0, progress=False)
    res = bench.run(pairs, opts, None, "python -m harness bench")
    assert res["interrupted"] == "time limit of 0 s reached"
    assert len(res["rows"]) == len(pairs) and all(r["status"] == "SKIP" for r in res["rows"])
    assert [(r["op"], r["case"]) for r in res["rows"]] == [(c.op, c.id) for c, _ in pairs]


def test_bench_resume_measures_only_what_the_earlier_run_left(tmp_path, cache, capsys):
    """A run stopped by its time limit leaves "not run" SKIP rows; --resume measures those pairs alone and
    writes one document with every row (the earlier rows kept as they were)."""
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps(CASES))
    assert main(["bench", "--cases", str(case_file), *FAST, "--report", str(tmp_path / "one"), "--no-plots"]) == 0
    first = json.loads((tmp_path / "one" / "results.json").read_text())
    cut = dict(first)
    cut["rows"] = [dict(r) for r in first["rows"]]
    for r in cut["rows"][2:]:  # as a time limit would have left the second case
        r.update(status="SKIP", reason="not run: time limit of 1 s reached", timing=None)
    cut["interrupted"] = "time limit of 1 s reached"
    (tmp_path / "cut.json").write_text(json.dumps(cut))
    capsys.readouterr()
    assert main(["bench", "--cases", str(case_file), *FAST, "--report", str(tmp_path / "two"), "--no-plots",
                 "--resume", str(tmp_path / "cut.json")]) == 0
    out = capsys.readouterr()
    assert "pairs=2 " in out.err and "4 timed, 0 failed, 0 skipped" in out.out
    res = json.loads((tmp_path / "two" / "results.json").read_text())
    assert [(r["case"], r["impl"], r["status"]) for r in res["rows"]] == \
        [(r["case"], r["impl"], "PASS") for r in first["rows"]]
    assert res["rows"][0]["timing"] == first["rows"][0]["timing"]  # kept, not measured again
    assert res["interrupted"] == "" and res["merged_from"] == [str(tmp_path / "cut.json"), "this run"]
    assert res["command"] == first["command"]
    assert main(["bench", "--cases", str(case_file), *FAST, "--report", str(tmp_path / "three"), "--no-plots",
                 "--resume", str(tmp_path / "two" / "results.json")]) == 0  # nothing left: the same rows
    assert "pairs=0 " in capsys.readouterr().err
    assert len(json.loads((tmp_path / "three" / "results.json").read_text())["rows"]) == 4



def test_bench_checkpoints_leave_a_document_to_resume_from(tmp_path, cache, monkeypatch, capsys):
    """Between pairs, every CHECKPOINT_S seconds, DIR/results.json holds the rows so far (with the earlier
    run's under --resume): a bench killed outright (SIGKILL, a machine taken back) leaves what it
    measured, and --resume from that file measures only the rest."""
    from harness import bench
    from harness.report import files

    monkeypatch.setattr(bench, "CHECKPOINT_S", -1.0)  # after every pair
    seen, real = [], files.write_json

    def spy(results, outdir):
        seen.append(json.loads(json.dumps(results, default=str)))
        return real(results, outdir)

    monkeypatch.setattr(files, "write_json", spy)
    case_file = tmp_path / "cases.json"
    case_file.write_text(json.dumps(CASES))
    args = ["bench", "--cases", str(case_file), "--device", "cpu", "--backend", "torch", "--mode", "hot",
            "--budget", "0.03", "--min-samples", "5", "--max-samples", "60", "--warmup-budget", "0.03", "-q",
            "--no-plots"]
    assert main([*args, "--report", str(tmp_path / "one")]) == 0
    checkpoints = [d for d in seen if d["interrupted"].startswith("checkpoint after")]
    assert [len(d["rows"]) for d in checkpoints] == [1, 2]
    assert all(r["status"] == "PASS" and r["timing"] for d in checkpoints for r in d["rows"])
    assert seen[-1]["interrupted"] == "" and len(seen[-1]["rows"]) == 2  # the final document
    (tmp_path / "killed.json").write_text(json.dumps(checkpoints[0]))  # as a run killed after one pair left it
    seen.clear()
    capsys.readouterr()
    assert main([*args, "--report", str(tmp_path / "two"), "--resume", str(tmp_path / "killed.json")]) == 0
    assert "pairs=1 " in capsys.readouterr().err
    resumed = [d for d in seen if d["interrupted"].startswith("checkpoint after")]
    assert [len(d["rows"]) for d in resumed] == [2]  # the earlier row and this run's
    res = json.loads((tmp_path / "two" / "results.json").read_text())
    assert [(r["case"], r["status"]) for r in res["rows"]] == [(r["case"], "PASS") for r in checkpoints[-1]["rows"]]
    assert res["rows"][0]["timing"] == checkpoints[0]["rows"][0]["timing"]  # kept, not measured again


def test_resume_runs_a_case_cut_part_way_whole_again():
    """A case whose earlier rows stop part-way (a time limit between its implementations) runs with every
    implementation again, so its ratios to the baselines come from one run; whole cases stay done."""
    from cases import select
    from harness import bench
    from harness.registry import discover

    discover()
    pairs = bench.plan(select("smoke"), ["binary_backward"], ["torch", "jax"], ["f32"], per_op=2)
    (c1, i1), (c2, i2) = pairs
    assert len(i1) == len(i2) == 2

    def row(case, impl, status, reason=None):
        return {"op": case.op, "case": case.id, "impl": impl.id, "status": status, "reason": reason}

    earlier = {"rows": [row(c1, i1[0], "PASS"), row(c1, i1[1], "PASS"),
                        row(c2, i2[0], "PASS"), row(c2, i2[1], "SKIP", "not run: time limit of 1 s reached")]}
    left = bench.left_to_run(pairs, earlier)
    assert [(c.id, [i.id for i in impls]) for c, impls in left] == [(c2.id, [i.id for i in i2])]
    earlier["rows"][3] = row(c2, i2[1], "SKIP", "jax: no GPU backend")  # a skip with a reason is a verdict
    assert bench.left_to_run(pairs, earlier) == []
