"""`harness run --sanitize TOOL`: each CUDA backend's cases under NVIDIA compute-sanitizer.

    python -m harness run --sanitize memcheck [--backend cupy] [--op binary_backward] [--cases smoke] [--json S.json]

One sanitizer process per backend, each an ordinary `harness run` of that backend alone
(`--backend B --device cuda`, the selected cases, default smoke), so an error is
attributed to one backend.  Per backend the verdict is

    clean       the tool's summary reports 0 errors (racecheck: 0 hazards) and the run
                finished with at least one case executed
    errors      the tool reported errors; the first few error blocks are kept
    incomplete  no summary from the tool, or the run under it did not finish (crashed,
                ran no case): a clean count from a run that stopped proves nothing
    timeout     the process overran --case-timeout (default 900 s per backend)
    unavailable the backend cannot run on this machine (its reason is given)

and `run` exits 0 only if every backend is clean and its cases pass.  The summary goes to
--json; the sanitizer logs and each inner run's own JSON and log go next to it
(`<json stem>-logs/`) or to a temporary folder that is printed.

What the sanitizer sees, and what is kept out of its way:
- only the backend under test runs, its cases judged by the numpy oracle (`--oracle numpy`
  unless asked otherwise), untimed: JAX/XLA never starts (its allocator and autotuning
  kernels are not ours) unless the backend itself is `jax`; the XLA allocator variables
  are set for that case (XLA_PYTHON_CLIENT_PREALLOCATE=false, ..._ALLOCATOR=platform).
- torch's caching allocator is off (PYTORCH_NO_CUDA_MEMORY_CACHING=1) and cupy's memory
  pools are off, so every buffer is its own cudaMalloc: an access past a tensor's end
  lands outside any allocation, where memcheck sees it, instead of inside a cached block.
- torch's own kernels (the NaN fill of the outputs, copies) run under the tool too; an
  error in one of them is reported with its kernel name like any other.
- library baselines (torch, torch_compile, jax, sdpa_*, liger, flash_attn) are not
  sanitized unless named with --backend; the default is every other CUDA backend (the
  project's kernels: cupy, torch_ext, triton, and installed third-party ones).

Sanitizer flags (`sanitizer_command`): --error-exitcode 86 (errors found), --check-exit-code
no and --require-cuda-init no (the harness's own exit status says whether its cases
passed, and a backend that skips everything is "incomplete", not a tool error),
--target-processes application-only (the run is one process; compilers it spawns, nvcc
and ptxas, use no GPU), --show-backtrace device (host frames through Python are noise),
--print-limit 20 (the summary still counts every error) and --log-file (the tool's report
apart from the run's own output).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from harness.status import FAILED, SKIP

TOOLS = ("memcheck", "racecheck", "initcheck", "synccheck")
ERROR_EXITCODE = 86
PRINT_LIMIT = 20
DEFAULT_TIMEOUT_S = 900.0
KEEP_BLOCKS = 5  # error blocks kept per backend
BLOCK_LINES = 10
PREFIX = "========="

# Set in the sanitized process's environment (see the module docstring).
INNER_ENV = {
    "PYTORCH_NO_CUDA_MEMORY_CACHING": "1",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    "XLA_PYTHON_CLIENT_ALLOCATOR": "platform",
    "PYTHONUNBUFFERED": "1",
}


class SanitizeError(SystemExit):
    """--sanitize cannot run here (no compute-sanitizer, no GPU): the message says why."""


def find_sanitizer(environ=None) -> str | None:
    """compute-sanitizer on PATH, else in $CUDA_HOME/bin, $CUDA_PATH/bin or /usr/local/cuda/bin."""
    environ = os.environ if environ is None else environ
    found = shutil.which("compute-sanitizer", path=environ.get("PATH"))
    if found:
        return found
    for base in (environ.get("CUDA_HOME"), environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base and os.access(Path(base) / "bin" / "compute-sanitizer", os.X_OK):
            return str(Path(base) / "bin" / "compute-sanitizer")
    return None


def sanitizer_command(sanitizer: str, tool: str, log_file: str, target: list[str]) -> list[str]:
    """The compute-sanitizer command line around `target` (see the module docstring for the flags)."""
    if tool not in TOOLS:
        raise ValueError(f"unknown sanitizer tool {tool!r}: expected one of {', '.join(TOOLS)}")
    return [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXITCODE), "--check-exit-code", "no",
            "--require-cuda-init", "no", "--target-processes", "application-only", "--show-backtrace", "device",
            "--print-limit", str(PRINT_LIMIT), "--log-file", log_file, *target]


def inner_run_args(backend: str, args, device: str, json_path: str) -> list[str]:
    """`harness run` arguments of one backend's sanitized run: that backend alone, untimed."""
    out = ["run", "--backend", backend, "--device", device, "--cases", args.cases, "--seed", str(args.seed),
           "--oracle", "numpy" if args.oracle == "auto" else args.oracle, "--json", json_path]
    for op in args.op or []:
        out += ["--op", op]
    for dtype in args.dtype or []:
        out += ["--dtype", dtype]
    return out


def target_command(run_args: list[str]) -> list[str]:
    """The process the sanitizer starts: this module's inner entry point, which runs `harness run`."""
    return [sys.executable, "-m", "harness.sanitize", *run_args]


# ----------------------------------------------------------------------------- reading the report


@dataclass
class SanitizerReport:
    """What one compute-sanitizer log says."""

    errors: int | None = None  # ERROR SUMMARY (None: no summary line)
    hazard_errors: int | None = None  # racecheck's RACECHECK SUMMARY: (errors, warnings)
    hazard_warnings: int | None = None
    blocks: list = field(default_factory=list)  # the first error blocks, each a list of lines
    block_count: int = 0  # blocks printed in all (the tool prints at most --print-limit)

    @property
    def summarized(self) -> bool:
        return self.errors is not None or self.hazard_errors is not None

    @property
    def findings(self) -> int:
        return max(self.errors or 0, (self.hazard_errors or 0) + (self.hazard_warnings or 0))

    def to_json(self) -> dict:
        return {"errors": self.errors, "hazard_errors": self.hazard_errors, "hazard_warnings": self.hazard_warnings,
                "blocks_printed": self.block_count, "first_errors": self.blocks}


_NUMBER = r"(\d[\d,]*)"
_ERROR_SUMMARY = re.compile(rf"ERROR SUMMARY:\s*{_NUMBER} errors?\s*$")  # not "... N errors were not printed"
_RACE_SUMMARY = re.compile(rf"RACECHECK SUMMARY:\s*{_NUMBER} hazards? displayed\s*\(\s*{_NUMBER} errors?,\s*"
                           rf"{_NUMBER} warnings?\s*\)")
_NOT_BLOCKS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY")


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def parse_report(text: str, keep: int = KEEP_BLOCKS) -> SanitizerReport:
    """Parse compute-sanitizer's text report.

    Every line of the tool starts with '========='; an error is a block: a line at the
    left margin ("Invalid __global__ write of size 4 bytes", "Error: Race reported
    between ...", "Uninitialized __global__ memory read ...", "Program hit
    cudaErrorLaunchFailure ...") followed by indented lines ("at kernel+0x70", "by thread
    (0,0,0) in block (0,0,0)", "Address 0x0 is out of bounds", ...) and closed by a bare
    '========='.  The totals come from "ERROR SUMMARY: N errors" (past --print-limit the
    tool adds "ERROR SUMMARY: M errors were not printed ...", which is not a total) and, for
    racecheck, "RACECHECK SUMMARY: H hazards displayed (E errors, W warnings)".  Lines
    without the prefix (the application's own output) are ignored.
    """
    report, block = SanitizerReport(), None
    for raw in text.splitlines():
        if not raw.startswith(PREFIX):
            continue
        body = raw[len(PREFIX):]
        body = body[1:] if body.startswith(" ") else body
        if not body.strip():
            block = None
            continue
        found = _ERROR_SUMMARY.search(body)
        if found:
            report.errors = (report.errors or 0) + _int(found.group(1))  # one summary per process
            block = None
            continue
        found = _RACE_SUMMARY.search(body)
        if found:
            report.hazard_errors = (report.hazard_errors or 0) + _int(found.group(2))
            report.hazard_warnings = (report.hazard_warnings or 0) + _int(found.group(3))
            block = None
            continue
        if body[0].isspace():
            if block is not None and len(block) < BLOCK_LINES:
                block.append(body.rstrip())
            continue
        if body.startswith(_NOT_BLOCKS):
            block = None
            continue
        report.block_count += 1
        block = [body.rstrip()]
        if len(report.blocks) < keep:
            report.blocks.append(block)
        else:
            block = None
    return report


def verdict(report: SanitizerReport, run: dict | None, timed_out: bool) -> tuple[str, str]:
    """(status, why) of one backend: see the module docstring for the statuses.

    run: the inner `harness run` JSON (None if it wrote none)."""
    if timed_out:
        return "timeout", "the sanitized run overran its time limit and was killed"
    if report.findings:
        parts = [f"{report.errors} errors"] if report.errors else []
        if report.hazard_errors is not None and report.hazard_errors + report.hazard_warnings:
            parts.append(f"{report.hazard_errors} race errors, {report.hazard_warnings} race warnings")
        return "errors", "; ".join(parts)
    if not report.summarized:
        return "incomplete", "the sanitizer printed no ERROR SUMMARY (it did not finish, or could not start)"
    if run is None:
        return "incomplete", "the run under the sanitizer wrote no results (it crashed or could not start)"
    ran = sum(v for k, v in (run.get("counts") or {}).items() if k != SKIP)
    if run.get("interrupted"):
        return "incomplete", f"the run under the sanitizer stopped: {run['interrupted']}"
    if not ran:
        return "incomplete", "no case ran under the sanitizer (every case skipped)"
    return "clean", f"0 errors in {ran} cases"


# ----------------------------------------------------------------------------- running it


def default_backends(op_filter=None) -> list[str]:
    """Every registered CUDA backend but the library baselines (backends/baselines/), restricted to
    backends of `op_filter`."""
    from harness.registry import BACKENDS, discover, is_baseline

    discover()
    names = []
    for name, be in sorted(BACKENDS.items()):
        if "cuda" not in be.devices or is_baseline(be):
            continue
        if op_filter and not any(op in op_filter for op, _ in be.impls):
            continue
        names.append(name)
    return names


@dataclass
class BackendRun:
    backend: str
    status: str
    why: str
    report: SanitizerReport = field(default_factory=SanitizerReport)
    command: list = field(default_factory=list)
    exit_code: int | None = None
    elapsed_s: float = 0.0
    counts: dict | None = None  # the inner run's PASS/FAIL/... counts
    log: str = ""

    def to_json(self) -> dict:
        return {"status": self.status, "why": self.why, **self.report.to_json(),
                "command": " ".join(_quote(c) for c in self.command), "exit_code": self.exit_code,
                "elapsed_s": round(self.elapsed_s, 1), "cases": self.counts, "log": self.log}


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def sanitize_backend(sanitizer: str, tool: str, backend: str, args, device: str, logdir: Path,
                     timeout: float) -> BackendRun:
    """One backend's cases under the sanitizer, in a process group killed at `timeout`."""
    logdir.mkdir(parents=True, exist_ok=True)
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", backend)
    log_file, out_file, run_json = (logdir / f"{slug}.{tool}.log", logdir / f"{slug}.run.log",
                                    logdir / f"{slug}.run.json")
    for stale in (log_file, run_json):
        stale.unlink(missing_ok=True)
    command = sanitizer_command(sanitizer, tool, str(log_file), target_command(
        inner_run_args(backend, args, device, str(run_json))))
    env = {**os.environ, **INNER_ENV}
    started, timed_out = time.monotonic(), False
    with open(out_file, "wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = log_file.read_text(errors="replace") if log_file.exists() else ""
    if not text.strip():  # the tool could not open its log: its complaints went to stdout
        text = out_file.read_text(errors="replace")
    report = parse_report(text)
    run = json.loads(run_json.read_text()) if run_json.exists() else None
    status, why = verdict(report, run, timed_out)
    if status == "incomplete":
        tail = [line for line in out_file.read_text(errors="replace").splitlines() if line.strip()][-3:]
        why += "".join(f"\n    {line}" for line in tail)
    return BackendRun(backend, status, why, report, command, proc.returncode, time.monotonic() - started,
                      run.get("counts") if run else None, str(log_file))


def _logdir(json_path: str | None) -> Path:
    if json_path:
        path = Path(json_path)
        logdir = path.parent / f"{path.name.split('.')[0]}-logs"
    else:
        logdir = Path(tempfile.mkdtemp(prefix="gradoracle-sanitize-"))
    logdir.mkdir(parents=True, exist_ok=True)
    return logdir


def _gpu_visible() -> bool:
    from harness import frameworks

    return frameworks.default_device() == "cuda"


def preflight(args, environ=None) -> str:
    """The sanitizer's path, or SanitizeError with what is missing (the tool, a GPU)."""
    sanitizer = find_sanitizer(environ)
    if sanitizer is None:
        raise SanitizeError("error: --sanitize needs NVIDIA compute-sanitizer (part of the CUDA toolkit): not found "
                            "on PATH nor in $CUDA_HOME/bin, $CUDA_PATH/bin or /usr/local/cuda/bin")
    if args.device == "cpu":
        raise SanitizeError("error: --sanitize checks CUDA kernels: it runs with --device cuda, not cpu")
    if args.isolate or args.gpus or args.shard or args.resume:
        raise SanitizeError("error: --sanitize runs one process per backend itself: "
                            "it does not combine with --isolate, --gpus, --shard or --resume")
    if not _gpu_visible():
        raise SanitizeError("error: --sanitize needs a CUDA GPU, and none is visible here "
                            "(torch.cuda.is_available() is False; check CUDA_VISIBLE_DEVICES and the driver)")
    return sanitizer


def _version(sanitizer: str) -> str:
    try:
        out = subprocess.run([sanitizer, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def cmd_sanitize(args) -> int:
    """`harness run --sanitize TOOL`: every selected backend under the tool; exit 0 only if all are clean."""
    import random

    from harness.registry import BACKENDS, discover

    sanitizer = preflight(args)
    discover()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    backends = args.backend or default_backends(args.op)
    if not backends:
        raise SanitizeError("error: --sanitize: no CUDA backend is registered for the selection")
    logdir = _logdir(args.json)
    timeout = args.case_timeout or DEFAULT_TIMEOUT_S
    print(f"sanitize tool={args.sanitize} cases={args.cases} seed={args.seed} backends={','.join(backends)}")
    version = _version(sanitizer)
    print(f"sanitizer {sanitizer} {version}; logs in {logdir}")
    runs = []
    for backend in backends:
        be = BACKENDS.get(backend.split("@")[0])
        reason = be.unavailable_reason("cuda") if be else f"no backend named {backend!r}"
        if reason:  # also builds torch_ext here, outside the sanitizer
            runs.append(BackendRun(backend, "unavailable", reason))
        else:
            runs.append(sanitize_backend(sanitizer, args.sanitize, backend, args, "cuda", logdir, timeout))
        _print_run(runs[-1])
    clean = all(r.status == "clean" for r in runs)
    failed = any((r.counts or {}).get(s) for r in runs for s in FAILED)
    print(f"sanitize {args.sanitize}: {sum(r.status == 'clean' for r in runs)} of {len(runs)} backends clean"
          + ("; some cases failed their oracle check (see the run logs)" if failed else ""))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({
            "tool": args.sanitize, "sanitizer": sanitizer, "sanitizer_version": version,
            "cases": args.cases, "op": args.op, "dtype": args.dtype, "seed": args.seed, "environment": INNER_ENV,
            "clean": clean, "backends": {r.backend: r.to_json() for r in runs}}, indent=1))
    return 0 if clean and not failed else 1


def _print_run(r: BackendRun) -> None:
    cases = ""
    if r.counts:
        cases = " [cases: " + ", ".join(f"{v} {k.lower()}" for k, v in r.counts.items() if v) + "]"
    print(f"{r.status.upper():11} {r.backend:16} {r.why.splitlines()[0] if r.why else ''}{cases} "
          f"({r.elapsed_s:.0f}s)")
    for line in r.why.splitlines()[1:]:
        print(line)
    for block in r.report.blocks:
        print("    " + "\n    ".join(block))
    if r.report.block_count > len(r.report.blocks):
        print(f"    ... {r.report.block_count - len(r.report.blocks)} more error blocks in {r.log}")


# ----------------------------------------------------------------------------- inside the sanitizer


def inner_main(argv: list[str]) -> int:
    """The sanitized process: cupy's memory pools off (torch's cache is off by environment), then the
    `python -m harness` program with `argv`, run as a program (runpy): the CLI sits above this module."""
    import runpy

    try:
        import cupy

        cupy.cuda.set_allocator(None)
        cupy.cuda.set_pinned_memory_allocator(None)
    except Exception:  # noqa: BLE001 - no cupy: nothing to turn off
        pass
    sys.argv = ["python -m harness", *argv]
    runpy.run_module("harness", run_name="__main__", alter_sys=True)  # exits with the run's status (SystemExit)
    return 0


if __name__ == "__main__":
    sys.exit(inner_main(sys.argv[1:]))
