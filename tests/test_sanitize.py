"""`harness run --sanitize` without a GPU: command lines, report parsing, verdicts, and the errors
when compute-sanitizer or a GPU is missing (harness/sanitize.py).

The sample reports below are written by hand in compute-sanitizer's documented format
(every line prefixed '=========', an error as a block closed by a bare prefix line, then
"ERROR SUMMARY: N errors" or racecheck's "RACECHECK SUMMARY"); application output is
interleaved where the tool writes to stdout.  A fake compute-sanitizer (a script that
writes a recorded report to --log-file and runs its target) drives one real CPU run.
"""
import json
import os
import stat
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from harness import sanitize
from harness.sanitize import parse_report, sanitizer_command, verdict

ROOT = Path(__file__).resolve().parents[1]

MEMCHECK_ERRORS = """\
========= COMPUTE-SANITIZER
device=cuda cases=smoke seed=5 oracle=numpy
========= Invalid __global__ write of size 4 bytes
=========     at bb_reduce_rows<float, 2>(BBParams)+0x4f0 in binary_backward.cuh:212
=========     by thread (255,0,0) in block (3,0,0)
=========     Address 0x7f2a4c000400 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f2a4c000000 of size 1,023 bytes
=========     Device Frame: bb_reduce_rows<float, 2>(BBParams)+0x4f0 in binary_backward.cuh:212
=========
========= Invalid __global__ read of size 2 bytes
=========     at bb_elementwise<__half, 1>(BBParams)+0x1a0 in binary_backward.cuh:130
=========     by thread (31,0,0) in block (0,0,0)
=========     Address 0x7f2a4c100040 is misaligned
=========
========= Program hit cudaErrorLaunchFailure (error 719) due to "unspecified launch failure" on CUDA API call to cudaStreamSynchronize.
=========
PASS   binary_backward  cupy@opt         add[f32,A=2x3x4x5,B=2x3x4x5]
========= ERROR SUMMARY: 3 errors
"""

MEMCHECK_CLEAN = """\
========= COMPUTE-SANITIZER
========= ERROR SUMMARY: 0 errors
"""

MEMCHECK_OVER_LIMIT = """\
========= COMPUTE-SANITIZER
""" + "".join(f"""\
========= Invalid __global__ write of size 4 bytes
=========     at write_wild(float *, int)+0x90
=========     by thread ({i},0,0) in block (0,0,0)
=========     Address 0x0 is out of bounds
=========
""" for i in range(20)) + """\
========= ERROR SUMMARY: 1,024 errors
========= ERROR SUMMARY: 1004 errors were not displayed
"""

RACECHECK_HAZARD = """\
========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at bb_reduce_cols<float>(BBParams)+0x3c0 in binary_backward.cuh:301
=========     and Read access at bb_reduce_cols<float>(BBParams)+0x410 in binary_backward.cuh:305 [248 hazards]
=========
========= Warning: Race reported between Read access at bb_tile<float>(BBParams)+0x100
=========     and Write access at bb_tile<float>(BBParams)+0x180 [8 hazards]
=========
========= RACECHECK SUMMARY: 2 hazards displayed (1 error, 1 warning)
"""

RACECHECK_CLEAN = """\
========= COMPUTE-SANITIZER
========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)
"""

INITCHECK_ERROR = """\
========= COMPUTE-SANITIZER
========= Uninitialized __global__ memory read of size 4 bytes
=========     at bb_finish_partials<float>(BBParams)+0x220
=========     by thread (0,0,0) in block (0,0,0)
=========     Address 0x7f2a4c200000
=========
========= ERROR SUMMARY: 1 error
"""

TRUNCATED = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at write_wild(float *, int)+0x90
"""

TOOL_FAILED = """\
========= COMPUTE-SANITIZER
========= Error: Target application terminated before first instrumented API call
========= Error: No attachable process found. compute-sanitizer timed-out.
"""

RUN_OK = {"counts": {"PASS": 24, "FAIL": 0, "ERROR": 0, "SKIP": 3}, "interrupted": None}


# ----------------------------------------------------------------------------- parsing


def test_memcheck_errors_are_counted_and_their_first_blocks_kept():
    report = parse_report(MEMCHECK_ERRORS)
    assert report.errors == 3 and report.findings == 3 and report.block_count == 3
    first = report.blocks[0]
    assert first[0] == "Invalid __global__ write of size 4 bytes"
    assert first[1].strip().startswith("at bb_reduce_rows<float, 2>(BBParams)+0x4f0")
    assert "by thread (255,0,0) in block (3,0,0)" in first[2]
    assert report.blocks[1][0] == "Invalid __global__ read of size 2 bytes"
    assert report.blocks[2][0].startswith("Program hit cudaErrorLaunchFailure (error 719)")
    assert not any("PASS" in line for block in report.blocks for line in block)  # the app's own output is not the tool's


def test_a_clean_report():
    report = parse_report(MEMCHECK_CLEAN)
    assert report.errors == 0 and report.findings == 0 and report.blocks == [] and report.summarized


def test_the_summary_counts_beyond_the_print_limit():
    report = parse_report(MEMCHECK_OVER_LIMIT, keep=5)
    assert report.errors == 1024 and len(report.blocks) == 5 and report.block_count == 20


def test_racecheck_hazards_errors_and_warnings():
    report = parse_report(RACECHECK_HAZARD)
    assert (report.hazard_errors, report.hazard_warnings, report.errors) == (1, 1, None)
    assert report.findings == 2 and report.summarized
    assert report.blocks[0][0].startswith("Error: Race reported between Write access at bb_reduce_cols")
    assert report.blocks[0][1].strip().startswith("and Read access at")
    assert report.blocks[1][0].startswith("Warning: Race reported")
    clean = parse_report(RACECHECK_CLEAN)
    assert (clean.hazard_errors, clean.hazard_warnings, clean.findings) == (0, 0, 0)


def test_initcheck_uninitialized_read():
    report = parse_report(INITCHECK_ERROR)
    assert report.errors == 1 and report.blocks[0][0] == "Uninitialized __global__ memory read of size 4 bytes"


def test_no_summary_means_the_tool_did_not_finish():
    for text in (TRUNCATED, TOOL_FAILED, ""):
        assert not parse_report(text).summarized


# ----------------------------------------------------------------------------- verdicts


def test_verdicts():
    assert verdict(parse_report(MEMCHECK_CLEAN), RUN_OK, False) == ("clean", "0 errors in 24 cases")
    assert verdict(parse_report(RACECHECK_CLEAN), RUN_OK, False)[0] == "clean"
    status, why = verdict(parse_report(MEMCHECK_ERRORS), RUN_OK, False)
    assert status == "errors" and why == "3 errors"
    assert verdict(parse_report(RACECHECK_HAZARD), RUN_OK, False) == ("errors", "1 race errors, 1 race warnings")
    assert verdict(parse_report(MEMCHECK_ERRORS), None, False)[0] == "errors"  # errors count even if the run died
    assert verdict(parse_report(TRUNCATED), RUN_OK, False)[0] == "incomplete"
    assert verdict(parse_report(MEMCHECK_CLEAN), None, False)[0] == "incomplete"  # a clean count from a dead run
    stopped = {"counts": {"PASS": 2, "CRASH": 1}, "interrupted": "stopped after 3 results: CUDA context lost"}
    assert verdict(parse_report(MEMCHECK_CLEAN), stopped, False)[0] == "incomplete"
    skipped = {"counts": {"PASS": 0, "SKIP": 24}, "interrupted": None}
    assert verdict(parse_report(MEMCHECK_CLEAN), skipped, False) == \
           ("incomplete", "no case ran under the sanitizer (every case skipped)")
    assert verdict(parse_report(""), None, True)[0] == "timeout"


# ----------------------------------------------------------------------------- command lines


def _args(**kw):
    base = dict(cases="smoke", seed=5, oracle="auto", op=["binary_backward"], dtype=None, json=None,
                case_timeout=None, device="auto", isolate=False, gpus=None, shard=None, resume=None,
                backend=None, sanitize="memcheck")
    return Namespace(**{**base, **kw})


def test_sanitizer_command_line():
    target = sanitize.target_command(sanitize.inner_run_args("cupy", _args(dtype=["bf16"]), "cuda", "/l/cupy.run.json"))
    cmd = sanitizer_command("/usr/local/cuda/bin/compute-sanitizer", "racecheck", "/l/cupy.racecheck.log", target)
    assert cmd[0] == "/usr/local/cuda/bin/compute-sanitizer"
    joined = " ".join(cmd)
    for part in ("--tool racecheck", "--error-exitcode 86", "--check-exit-code no", "--require-cuda-init no",
                 "--target-processes application-only", "--log-file /l/cupy.racecheck.log",
                 f"{sys.executable} -m harness.sanitize run --backend cupy --device cuda --cases smoke --seed 5 "
                 "--oracle numpy --json /l/cupy.run.json --op binary_backward --dtype bf16"):
        assert part in joined, part
    assert cmd.index("--log-file") < cmd.index(sys.executable)  # every tool option before the target
    with pytest.raises(ValueError, match="unknown sanitizer tool"):
        sanitizer_command("cs", "leakcheck", "x.log", target)
    assert sanitize.INNER_ENV["PYTORCH_NO_CUDA_MEMORY_CACHING"] == "1"


def test_the_default_backends_are_the_project_kernels():
    names = sanitize.default_backends(["binary_backward"])
    assert {"cupy", "torch_ext", "triton"} <= set(names)
    assert not set(names) & {"torch", "torch_compile", "jax"}  # library baselines, unless named
    assert "sdpa_flash" not in sanitize.default_backends(None)


def test_find_sanitizer(tmp_path):
    assert sanitize.find_sanitizer({"PATH": str(tmp_path), "CUDA_HOME": str(tmp_path / "none")}) in \
           (None, "/usr/local/cuda/bin/compute-sanitizer")
    tool = _fake_sanitizer(tmp_path / "cuda" / "bin", MEMCHECK_CLEAN)
    assert sanitize.find_sanitizer({"PATH": "", "CUDA_HOME": str(tmp_path / "cuda")}) == str(tool)
    assert sanitize.find_sanitizer({"PATH": str(tool.parent)}) == str(tool)


# ----------------------------------------------------------------------------- with a fake compute-sanitizer

_FAKE = '''#!{python}
"""A stand-in for compute-sanitizer: writes a recorded report to --log-file, then runs the target."""
import subprocess, sys
argv, i, opts = sys.argv, 1, {{}}
while i < len(argv) and argv[i].startswith("--"):
    opts[argv[i]] = argv[i + 1]
    i += 2
if i == len(argv):
    print("compute-sanitizer 2099.1.0 (fake)")
    sys.exit(0)
rc = subprocess.call(argv[i:])
open(opts["--log-file"], "w").write({report!r})
sys.exit({exit!r} if "ERROR SUMMARY: 0" not in {report!r} else 0)
'''


def _fake_sanitizer(folder: Path, report: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    tool = folder / "compute-sanitizer"
    tool.write_text(_FAKE.format(python=sys.executable, report=report, exit=sanitize.ERROR_EXITCODE))
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    return tool


def _cpu_args():
    return _args(backend=["torch"], dtype=["f64"], op=["binary_backward"])


def test_a_backend_run_under_a_clean_fake_sanitizer(tmp_path):
    tool = _fake_sanitizer(tmp_path / "bin", MEMCHECK_CLEAN)
    run = sanitize.sanitize_backend(str(tool), "memcheck", "torch", _cpu_args(), "cpu", tmp_path / "logs", 600)
    assert run.status == "clean", run.why
    assert run.counts["PASS"] == 8 and run.exit_code == 0
    assert json.loads((tmp_path / "logs" / "torch.run.json").read_text())["oracle"] == "numpy"
    assert run.to_json()["command"].startswith(f"{tool} --tool memcheck")


def test_a_backend_run_with_errors_reports_them(tmp_path, capsys):
    tool = _fake_sanitizer(tmp_path / "bin", MEMCHECK_ERRORS)
    run = sanitize.sanitize_backend(str(tool), "memcheck", "torch", _cpu_args(), "cpu", tmp_path / "logs", 600)
    assert run.status == "errors" and run.exit_code == sanitize.ERROR_EXITCODE
    assert run.to_json()["errors"] == 3 and run.to_json()["first_errors"][0][0].startswith("Invalid __global__ write")
    sanitize._print_run(run)
    printed = capsys.readouterr().out
    assert printed.startswith("ERRORS      torch            3 errors") and "by thread (255,0,0)" in printed


def test_a_tool_that_never_summarizes_is_incomplete(tmp_path):
    tool = _fake_sanitizer(tmp_path / "bin", TOOL_FAILED)
    run = sanitize.sanitize_backend(str(tool), "initcheck", "torch", _cpu_args(), "cpu", tmp_path / "logs", 600)
    assert run.status == "incomplete" and "no ERROR SUMMARY" in run.why


def test_the_command_finds_a_named_backend(tmp_path, monkeypatch, capsys):
    """--backend B: the registry is searched (discovered) before B is looked up."""
    tool = _fake_sanitizer(tmp_path / "bin", MEMCHECK_CLEAN)
    monkeypatch.setenv("PATH", f"{tool.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(sanitize, "_gpu_visible", lambda: True)
    out = tmp_path / "s.json"
    sanitize.cmd_sanitize(_args(backend=["torch"], dtype=["f64"], json=str(out)))
    summary = json.loads(out.read_text())
    assert summary["tool"] == "memcheck" and list(summary["backends"]) == ["torch"]
    assert "no backend named" not in summary["backends"]["torch"]["why"]
    assert (tmp_path / "s-logs").is_dir()
    assert "sanitize memcheck: " in capsys.readouterr().out


# ----------------------------------------------------------------------------- the command's errors


def _harness(*args, env):
    return subprocess.run([sys.executable, "-m", "harness", "run", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.skipif(os.access("/usr/local/cuda/bin/compute-sanitizer", os.X_OK),
                    reason="compute-sanitizer is installed in /usr/local/cuda")
def test_a_clear_error_without_compute_sanitizer(tmp_path):
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:/usr/bin:/bin", CUDA_HOME=str(tmp_path),
               CUDA_PATH=str(tmp_path))
    out = _harness("--sanitize", "memcheck", env=env)
    assert out.returncode != 0
    assert "--sanitize needs NVIDIA compute-sanitizer" in out.stderr and "not found" in out.stderr


def test_a_clear_error_without_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is visible")
    tool = _fake_sanitizer(tmp_path / "bin", MEMCHECK_CLEAN)
    env = dict(os.environ, PATH=f"{tool.parent}:{os.environ['PATH']}")
    out = _harness("--sanitize", "racecheck", "--op", "binary_backward", env=env)
    assert out.returncode != 0 and "--sanitize needs a CUDA GPU, and none is visible here" in out.stderr
    out = _harness("--sanitize", "memcheck", "--device", "cpu", env=env)
    assert out.returncode != 0 and "runs with --device cuda, not cpu" in out.stderr
