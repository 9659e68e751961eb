"""`harness run --gpus N` and pytest-xdist pinning (harness/multi_gpu/).

On the CPU, `--gpus N --device cpu` runs N CPU workers: the merge is what is tested.
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import _parse
from harness.multi_gpu.gpus import visible_gpus
from harness.multi_gpu.merge import merge
from harness.multi_gpu.workers import THREAD_VARS, worker_argv, worker_env
from harness.multi_gpu.xdist import pin_xdist_worker

ROOT = Path(__file__).resolve().parents[1]


def harness(*args, env=None):
    return subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def _verdicts(data):
    return [(r["impl"], r["case"], r["status"], [(o["name"], o["passed"], o["max_rel"], o["worst_ratio"])
                                                 for o in r["outputs"]]) for r in data["results"]]


def test_gpus_on_cpu_workers_merge_to_the_single_run(tmp_path):
    selection = ("--backend", "torch", "--backend", "torch_ext", "--op", "binary_backward", "--op", "reduce_sum",
                 "--device", "cpu", "--seed", "1234")
    single = harness(*selection, "--json", str(tmp_path / "single.json"))
    merged = harness(*selection, "--gpus", "3", "--json", str(tmp_path / "merged.json"))
    assert single.returncode == merged.returncode == 0, merged.stdout[-3000:] + merged.stderr
    one, many = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("single", "merged"))
    assert _verdicts(many) == _verdicts(one)  # same rows, same order, same errors
    assert many["counts"] == one["counts"] and many["seed"] == one["seed"] == 1234
    assert {k for k in one if k != "results"} <= set(many)  # a single run's keys, plus the workers'
    assert [w["shard"] for w in many["workers"]] == ["0/3", "1/3", "2/3"]
    assert all(w["exit_code"] == 0 for w in many["workers"])
    assert {r["worker"] for r in many["results"]} == {0, 1, 2} and {r["gpu"] for r in many["results"]} == {None}
    assert f"{one['counts']['PASS']} passed, 0 failed" in merged.stdout and "(3 workers)" in merged.stdout
    assert merged.stdout.count("PASS   binary_backward") == single.stdout.count("PASS   binary_backward")


def test_gpus_with_isolate_carries_crashes_into_the_merge(tmp_path):
    env = dict(os.environ, GRADORACLE_BACKENDS="planted_crash", PYTHONPATH=str(ROOT / "tests"))
    cases = ('[{"op":"binary_backward","dtype":"f32","params":{"fn":"mul","a":[2,3],"b":[3]}},'
             '{"op":"binary_backward","dtype":"f32","params":{"fn":"add","a":[4],"b":[1]}}]')
    out = harness("--gpus", "2", "--isolate", "--device", "cpu", "--backend", "planted_crash@segfault",
                  "--backend", "planted_crash@correct", "--cases", cases, "--json", str(tmp_path / "m.json"), env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert [(r["impl"], r["status"], r["worker"]) for r in data["results"]] == [
        ("planted_crash@correct", "PASS", 0), ("planted_crash@segfault", "CRASH", 0),
        ("planted_crash@correct", "PASS", 1), ("planted_crash@segfault", "CRASH", 1)]
    assert data["counts"]["CRASH"] == 2 and data["interrupted"] is None
    assert "2 passed, 2 failed (2 crashed, 0 timed out)" in out.stdout


def test_a_worker_that_stops_on_a_lost_context_is_reported(tmp_path):
    env = dict(os.environ, GRADORACLE_BACKENDS="planted_crash", PYTHONPATH=str(ROOT / "tests"))
    out = harness("--gpus", "2", "--device", "cpu", "--backend", "planted_crash@sticky", "--op", "binary_backward",
                  "--dtype", "f64", "--json", str(tmp_path / "m.json"), "--no-isolate", env=env)
    assert out.returncode == 3, out.stdout + out.stderr
    data = json.loads((tmp_path / "m.json").read_text())
    assert [w["exit_code"] for w in data["workers"]] == [3, 3]
    assert data["interrupted"].startswith("incomplete: worker 0 (cpu, shard 0/2) exited with status 3")
    assert "stopped on a lost CUDA context" in out.stderr


def test_worker_argv_passes_every_option_on_and_sets_its_own():
    args = _parse(["run", "--gpus", "4", "--backend", "cupy", "--backend", "triton", "--op", "binary_backward",
                   "--cases", "full", "--dtype", "bf16", "--isolate", "--case-timeout", "30", "--time", "-v",
                   "--json", "x.json", "--seed", "9", "--oracle", "numpy"])
    argv = worker_argv(args, "1/4", "cuda", "/tmp/w1.json")
    assert argv[0] == "run"
    assert "--gpus" not in argv and "x.json" not in argv
    joined = " ".join(argv)
    for part in ("--backend cupy --backend triton", "--op binary_backward", "--cases full", "--dtype bf16",
                 "--isolate", "--case-timeout 30.0", "--time", "-v", "--oracle numpy",
                 "--shard 1/4 --seed 9 --device cuda --json /tmp/w1.json"):
        assert part in joined, part
    again = _parse(argv)  # and the worker parses it back to the same selection
    assert (again.backend, again.op, again.cases, again.dtype, again.isolate, again.case_timeout, again.seed) == \
           (args.backend, args.op, args.cases, args.dtype, True, 30.0, 9)


def test_worker_env_pins_the_gpu_and_shares_the_cores():
    env = worker_env("3", 4, environ={"PATH": "/bin"}, cpus=16)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin" and env["PYTHONUNBUFFERED"] == "1"
    assert [env[v] for v in THREAD_VARS] == ["4"] * len(THREAD_VARS)
    assert worker_env(None, 8, environ={}, cpus=2)["OMP_NUM_THREADS"] == "1"  # at least one thread each
    assert "CUDA_VISIBLE_DEVICES" not in worker_env(None, 2, environ={}, cpus=2)
    kept = worker_env("0", 4, environ={"OPENBLAS_NUM_THREADS": "7"}, cpus=16)  # the user's count stays
    assert kept["OPENBLAS_NUM_THREADS"] == "7" and "OMP_NUM_THREADS" not in kept


def test_gpus_refuses_what_it_cannot_do():
    out = harness("--gpus", "2", "--shard", "0/2", "--device", "cpu")
    assert out.returncode != 0 and "drop --shard" in out.stderr
    out = harness("--gpus", "2", "--device", "cuda", env=dict(os.environ, CUDA_VISIBLE_DEVICES="0"))
    assert out.returncode != 0 and "--gpus 2: only 1 GPU(s) visible (CUDA_VISIBLE_DEVICES=0)" in out.stderr


def test_merge_dedupes_resumed_rows_and_restores_the_single_run_order():
    def row(impl, case, status="PASS"):
        return {"op": "binary_backward", "impl": impl, "case": case, "status": status}

    order = {("binary_backward", "c0"): (0, 0), ("binary_backward", "c1"): (0, 1), ("binary_backward", "c2"): (0, 2)}
    resumed = [row("torch", "c1")]
    w0 = {"results": [row("torch", "c1"), row("torch", "c0"), row("cupy", "c0"), row("torch", "c2")]}
    w1 = {"results": [row("torch", "c1"), row("cupy", "c1", "FAIL")]}
    rows = merge([w0, w1], ["3", "5"], resumed, order)
    assert [(r["impl"], r["case"], r.get("gpu")) for r in rows] == [
        ("torch", "c1", None), ("torch", "c0", "3"), ("cupy", "c0", "3"), ("cupy", "c1", "5"), ("torch", "c2", "3")]
    assert merge([None, w1], [None, None], [], order)[0]["worker"] == 1  # a worker that wrote nothing


# ----------------------------------------------------------------------------- pinning


def test_xdist_workers_are_pinned_round_robin():
    env = {"PYTEST_XDIST_WORKER": "gw5"}
    assert pin_xdist_worker(env, count=lambda: 4) == "1" and env["CUDA_VISIBLE_DEVICES"] == "1"
    env = {"PYTEST_XDIST_WORKER": "gw3", "CUDA_VISIBLE_DEVICES": "2,5"}  # only the visible ones
    assert pin_xdist_worker(env, count=lambda: 8) == "5" and env["CUDA_VISIBLE_DEVICES"] == "5"
    env = {"PYTEST_XDIST_WORKER": "gw0"}
    assert pin_xdist_worker(env, count=lambda: 0) is None and "CUDA_VISIBLE_DEVICES" not in env  # no GPU
    env = {}
    assert pin_xdist_worker(env, count=lambda: 4) is None and env == {}  # not under xdist
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, count=lambda: 4) == []
    assert visible_gpus({}, count=lambda: 2) == ["0", "1"]


def test_pytest_n_runs_the_generated_tests_in_workers(tmp_path):
    pytest.importorskip("xdist")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider",
                          "tests/test_correctness.py", "--backend", "torch", "--op", "binary_backward",
                          "--dtype", "f64", "--device", "cpu", "--seed", "77"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "bringing up nodes" in out.stdout and "8 passed" in out.stdout
