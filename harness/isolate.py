"""How `harness run` executes a case: in this process, or in a worker subprocess (`--isolate`).

Both runners have one method, `run(impl, case) -> CaseResult`, and `close()`.

`InProcessRunner` calls `runner.run_case` here.  When a case raises a *sticky* CUDA error
(harness.cuda_errors: an illegal address, a launch failure, ...) the CUDA context of this
process is lost and no later case could run in it: that case becomes a CRASH row, `lost`
says why, and `harness run` stops there (saving its JSON, exit status 3).

`IsolatedRunner` runs each case in a worker process (`python -m harness.isolate`) and keeps
that worker for the next case.  When the worker dies or overruns, the case is marked and
the worker replaced, so the run goes on:

    CRASH    the worker died during the case: a signal (SIGSEGV, SIGABRT, ...), an exit
             status, or a sticky CUDA error it reported before exiting.  The reason holds
             the signal name or status and the worker's last stderr lines (faulthandler's
             Python stack for a fatal signal).
    TIMEOUT  no result within `case_timeout` seconds of the case's start (after its
             backend was imported and loaded, so a first-use build does not count).  The
             worker's Python stacks are dumped into the reason, then it is killed.

Both count as failures; their rows carry the one-line repro command.  An ordinary
exception in the worker (not sticky) is an ERROR row and the worker lives on.

`harness bench` uses the same worker through `IsolatedRunner.call`: a job with a "bench" key has
the worker prepare the case's inputs (once for all its implementations: bench.in_worker) and time
one implementation with bench.bench_pair; the reply's row is the one the in-process bench builds.

Protocol: the parent writes one JSON job per line on the worker's stdin; the worker answers
on its original stdout, one JSON message per line: {"ready": pid} once, then per job
{"started": true} and {"result": row} (bench adds "clock_mhz") or {"error": text, "sticky": name|null}.  The worker
points its fd 1 at stderr first, so prints (and C printf) from backends never reach the
protocol.  Its stderr goes to a log file the parent reads back after a crash.

A job names the module that registers the implementation's backend, so a worker imports
only what its cases need; backends that live outside the `backends` package (entry points,
GRADORACLE_BACKENDS, test fixtures registered by hand) are found the same way, the
module's folder added to the worker's PYTHONPATH.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import status
from harness.cuda_errors import sticky_cuda_error
from harness.results import CaseResult
from harness.runner import env_assignments, module_root, repro_command, run_case

DEFAULT_CASE_TIMEOUT_S = 300.0
SETUP_TIMEOUT_S = 900.0  # a worker's start, or a backend's first import and build (torch_ext compiles)
STICKY_EXIT = 3  # a worker (or `harness run`) that stopped on a lost CUDA context exits with this
STDERR_LINES = 12
WARM_ENV = "GRADORACLE_WARM_IMPORTS"  # modules a prestarted worker imports while its parent selects the cases


def repro(impl, case, run_seed: int, device: str) -> str:
    """runner.repro_command (prefixed with GRADORACLE_BACKENDS when the backend comes from it), see `named`."""
    return named(impl, repro_command(impl, case, run_seed, device))


def named(impl, command: str) -> str:
    """A repro command, prefixed with GRADORACLE_BACKENDS=<its module> when the backend was registered
    by hand (no origin) and the command has no such prefix yet: the command must name the module."""
    if command and not impl.backend.origin and command.startswith("python -m "):  # no prefix yet
        command = env_assignments(backend_module(impl)) + command
    return command


def _crash_row(impl, case, device: str, seed: int, verdict: str, reason: str, **details) -> CaseResult:
    """A row this process writes for the case (a crash, a timeout, a worker's error); `details` go under "crash"."""
    return CaseResult(case.op, impl.id, case.id, case.dtype, device, verdict, reason=reason, seed=seed,
                      repro=repro(impl, case, seed, device), extra={"crash": details} if details else {})


class RunStopped(Exception):
    """`harness run` must stop: this process lost its CUDA context, or --isolate cannot start a worker."""


# ----------------------------------------------------------------------------- in this process


class InProcessRunner:
    """run_case in this process; a sticky CUDA error ends it (see the module docstring)."""

    def __init__(self, device: str, seed: int, oracle: str = "auto", timed: bool = False):
        self.device, self.seed, self.oracle, self.timed = device, seed, oracle, timed
        self.lost: str | None = None  # set once the CUDA context is gone: the message for the user

    def run(self, impl, case) -> CaseResult:
        try:
            result = run_case(impl, case, self.device, self.seed, self.oracle, timed=self.timed)
        except Exception as exc:  # noqa: BLE001 - only a sticky CUDA error is handled; the rest propagates
            name = sticky_cuda_error(exc)
            if name is None:
                raise
            return self._lost(impl, case, name, f"{type(exc).__name__}: {exc}")
        if result.status == status.ERROR and sticky_cuda_error(result.reason):
            return self._lost(impl, case, sticky_cuda_error(result.reason), result.reason)
        return result

    def _lost(self, impl, case, name: str, message: str) -> CaseResult:
        first, *more = message.strip().splitlines() or [name]
        self.lost = (f"CUDA context lost ({name}) in {impl.id} on {case.op} {case.id}: {first}\n"
                     f"Later cases cannot run in this process: the run stops here. "
                     f"Run with --isolate to run every case in a worker process that is replaced after a crash.")
        return _crash_row(impl, case, self.device, self.seed, status.CRASH,
                          f"CUDA context lost ({name}): {first}" + _block(more, ""), cuda_error=name)

    def close(self) -> None:
        pass


# ----------------------------------------------------------------------------- in a worker


class _Died(Exception):
    """The worker's stdout closed: it is gone."""


class _Worker:
    """One `python -m harness.isolate` process, its stdin/stdout protocol and its stderr log."""

    def __init__(self, env: dict, log: Path):
        self.log = log
        self.paths = set(filter(None, env.get("PYTHONPATH", "").split(os.pathsep)))  # what it can import from
        with open(log, "ab") as err:
            self.proc = subprocess.Popen([sys.executable, "-m", "harness.isolate"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err, env=env,
                                         start_new_session=True)  # its own group: killed whole, spared Ctrl-C
        self.buffer = b""
        self.pid = self.proc.pid

    def send(self, message: dict) -> None:
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode())
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError) as exc:
            raise _Died from exc

    def receive(self, deadline: float) -> dict | None:
        """The next message, or None at the deadline; _Died when the worker's stdout closes."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Died
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def stderr_size(self) -> int:
        return self.log.stat().st_size if self.log.exists() else 0

    def stderr_since(self, offset: int) -> str:
        with open(self.log, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def dump_stacks(self) -> None:
        """faulthandler in the worker prints every thread's Python stack on SIGUSR1."""
        try:
            os.kill(self.pid, signal.SIGUSR1)
        except ProcessLookupError:
            return
        time.sleep(0.5)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        self.wait()

    def wait(self, timeout: float = 10.0) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            for pipe in (self.proc.stdin, self.proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass


def exit_description(returncode: int | None) -> tuple[str, dict]:
    """('killed by SIGSEGV (Segmentation fault)', details) for a worker's exit status."""
    if returncode is None:
        return "did not exit", {}
    if returncode < 0:
        try:
            sig = signal.Signals(-returncode)
            return f"killed by {sig.name} ({signal.strsignal(sig)})", {"signal": sig.name, "exit_code": returncode}
        except ValueError:
            return f"killed by signal {-returncode}", {"exit_code": returncode}
    return f"exited with status {returncode}", {"exit_code": returncode}


def _noise(line: str) -> bool:
    """faulthandler's module list, the worker's own frames below run_case, caret underlines."""
    return (line.startswith("Extension modules:") or "<frozen runpy>" in line
            or f"{os.sep}harness{os.sep}isolate.py" in line or not line.strip(" ^~"))


def stderr_excerpt(text: str, limit: int = STDERR_LINES) -> list[str]:
    """The useful end of a worker's stderr for one case.

    With a faulthandler dump (a fatal signal, or the stacks dumped before a timeout kill):
    the few lines printed just before it (often the library's own message) and the dump's
    first frames, innermost first.  Otherwise its last `limit` lines.
    """
    lines = [line.rstrip() for line in text.splitlines() if line.strip() and not _noise(line)]
    starts = [i for i, line in enumerate(lines)
              if line.startswith(("Fatal Python error", "Current thread 0x", "Thread 0x"))]
    if not starts:
        return lines[-limit:]
    first = starts[0]
    return lines[max(0, first - 4):first] + lines[first:first + limit - min(first, 4)]


def _block(lines: list[str], colon: str = ":") -> str:
    """Lines to follow a reason's first line, indented like it when the CLI prints the row."""
    return colon + "".join(f"\n  {line}" for line in lines) if lines else ""


def _worker_env(roots: list[str]) -> dict:
    """The parent's environment, plus PYTHONPATH entries so the worker imports what the parent did."""
    env = dict(os.environ)
    base = [str(Path(__file__).resolve().parents[1])]  # the folder holding harness/, oracle/, cases/
    old = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(base + roots + ([old] if old else [])))
    env["PYTHONUNBUFFERED"] = "1"  # a crash must not swallow buffered prints
    return env


def backend_module(impl) -> str:
    """The module to import for `impl`'s backend: where discovery found it, else its function's module."""
    return impl.backend.origin or impl.fn.__module__


class IsolatedRunner:
    """Each case in a reused worker process; a crash or a hang costs that case only."""

    def __init__(self, device: str, seed: int, oracle: str = "auto", timed: bool = False,
                 case_timeout: float = DEFAULT_CASE_TIMEOUT_S, setup_timeout: float = SETUP_TIMEOUT_S):
        self.device, self.seed, self.oracle, self.timed = device, seed, oracle, timed
        self.case_timeout, self.setup_timeout = case_timeout, max(setup_timeout, case_timeout)
        self.lost = None  # a lost context only ever costs a worker
        self.worker: _Worker | None = None
        self.roots: list[str] = []  # folders of the backend modules, on every worker's PYTHONPATH
        self.tmp = tempfile.TemporaryDirectory(prefix="gradoracle-isolate-")
        self.started = 0  # workers started, for the log names
        self.first = _take_prestarted()  # a worker started early (prestart), adopted by the first case


    # -- worker lifecycle

    def _start(self) -> _Worker:
        self.started += 1
        worker, self.first = self.first, None
        if worker is None or not set(self.roots) <= worker.paths:
            if worker is not None:
                worker.kill()
            worker = _Worker(_worker_env(self.roots), Path(self.tmp.name) / f"worker-{self.started}.log")
        try:
            message = worker.receive(time.monotonic() + self.setup_timeout)
        except _Died:
            message = None
        if not message or "ready" not in message:
            worker.kill()
            how = exit_description(worker.proc.returncode)[0]
            tail = "\n".join(stderr_excerpt(worker.stderr_since(0)))
            raise RunStopped(f"--isolate: the worker process did not start ({how})" + (f":\n{tail}" if tail else ""))
        return worker

    def _retire(self) -> None:
        if self.worker is not None:
            self.worker.kill()
            self.worker = None

    def close(self) -> None:
        """End the workers.  Never raises KeyboardInterrupt: a run's results are in hand when this runs,
        and a signal (`timeout -s INT`) landing while a worker exits must not cost them; the worker is
        killed instead."""
        if self.worker is not None:
            try:
                self.worker.proc.stdin.close()  # end of jobs: the worker exits on EOF
            except OSError:
                pass
            try:
                if self.worker.wait(5) is None:
                    self.worker.kill()
            except KeyboardInterrupt:
                self.worker.kill()
            self.worker = None
        if self.first is not None:
            self.first.kill()
            self.first = None
        self.tmp.cleanup()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- one case

    def run(self, impl, case) -> CaseResult:
        reply = self.call(impl, case, {"timed": self.timed})
        if isinstance(reply, CaseResult):
            return reply
        row = CaseResult.from_json(reply["result"])
        row.repro = named(impl, row.repro)  # the worker cannot tell a hand-registered backend
        return row

    def call(self, impl, case, task: dict) -> dict | CaseResult:
        """Send one job (`task`: {"timed": bool} for run_case, {"bench": options} for bench.in_worker)
        and return the worker's reply ({"result": row JSON, ...}), or this process's CRASH, TIMEOUT or
        ERROR row when the worker died, overran or raised."""
        module = backend_module(impl)
        root = module_root(module)
        if root and root not in self.roots:
            self.roots.append(root)
            if self.worker is not None and root not in self.worker.paths:
                self._retire()  # a worker's PYTHONPATH is fixed at its start: the next one finds this module
        if self.worker is not None and self.worker.proc.poll() is not None:
            self._retire()  # it died between cases (nothing of this case's doing): start afresh
        if self.worker is None:
            self.worker = self._start()
        worker = self.worker
        offset = worker.stderr_size()
        job = {"module": module, "backend": impl.backend.name, "op": impl.op, "variant": impl.variant,
               "case": case.to_json(), "device": self.device, "seed": self.seed, "oracle": self.oracle, **task}
        started = time.monotonic()
        deadline = started + self.setup_timeout
        try:
            worker.send(job)
            while True:
                message = worker.receive(deadline)
                if message is None:
                    return self._timeout(impl, case, worker, offset, time.monotonic() - started)
                if "started" in message:  # the backend is imported and loaded: the case's clock starts
                    started = time.monotonic()
                    deadline = started + self.case_timeout
                elif "result" in message:
                    return message
                elif "error" in message:
                    return self._error(impl, case, worker, offset, message)
        except _Died:
            return self._died(impl, case, worker, offset)

    def _died(self, impl, case, worker: _Worker, offset: int) -> CaseResult:
        how, details = exit_description(worker.wait())
        lines = stderr_excerpt(worker.stderr_since(offset))
        self.worker = None
        reason = f"the worker process {how} during this case" + (_block(lines) if lines else " (nothing on stderr)")
        return _crash_row(impl, case, self.device, self.seed, status.CRASH, reason, stderr=lines, **details)

    def _timeout(self, impl, case, worker: _Worker, offset: int, waited: float) -> CaseResult:
        worker.dump_stacks()
        worker.kill()
        self.worker = None
        lines = stderr_excerpt(worker.stderr_since(offset))
        reason = (f"no result after {waited:.0f} s (--case-timeout {self.case_timeout:g}); the worker was killed"
                  + (_block(lines) if lines else ""))
        return _crash_row(impl, case, self.device, self.seed, status.TIMEOUT, reason, stderr=lines,
                          timeout_s=self.case_timeout)

    def _error(self, impl, case, worker: _Worker, offset: int, message: dict) -> CaseResult:
        if message.get("sticky"):  # the worker exits after reporting it: its context is gone
            worker.wait()
            self.worker = None
            first, *more = message["error"].strip().splitlines() or [""]
            return _crash_row(impl, case, self.device, self.seed, status.CRASH,
                              f"CUDA context lost ({message['sticky']}), the worker was replaced: {first}"
                              + _block(more, ""), cuda_error=message["sticky"])
        lines = [line for line in message.get("traceback", []) if not _noise(line)]
        return _crash_row(impl, case, self.device, self.seed, status.ERROR, message["error"] + _block(lines, ""))


_PRESTARTED: list = []  # [worker, its log folder] of prestart(), until a runner takes it


def prestart() -> None:
    """Start a worker now, while this process discovers the backends and selects the cases: the
    worker's own start (Python, the harness, the ops) overlaps that work instead of following it.
    Call it once TRITON_INTERPRET is decided (the worker inherits the environment).  The first
    IsolatedRunner adopts it; `discard_prestarted` ends it when the run is not isolated after all."""
    if not _PRESTARTED:
        import atexit

        folder = tempfile.TemporaryDirectory(prefix="gradoracle-isolate-")
        env = {**_worker_env([]), WARM_ENV: "torch"}  # what most backends import first, imported meanwhile
        _PRESTARTED[:] = [_Worker(env, Path(folder.name) / "worker-0.log"), folder]
        atexit.register(discard_prestarted)


def surely_no_gpu() -> bool:
    """True when no GPU device node exists (NVIDIA, WSL's /dev/dxg, ROCm's /dev/kfd): torch cannot see a
    GPU, so the default device is the CPU without importing torch to ask.  False: it may be either."""
    dev = Path("/dev")
    return not (any(dev.glob("nvidia[0-9]*")) or (dev / "dxg").exists() or (dev / "kfd").exists())


def _take_prestarted() -> _Worker | None:
    if not _PRESTARTED:
        return None
    worker, _ = _PRESTARTED
    _PRESTARTED[0] = None  # the folder stays (the log lives there) until discard_prestarted at exit
    return worker


def discard_prestarted() -> None:
    """End a prestarted worker no runner took, and remove its log folder."""
    if _PRESTARTED:
        worker, folder = _PRESTARTED
        if worker is not None:
            worker.kill()
        folder.cleanup()
        _PRESTARTED.clear()


def make_runner(args, device: str):
    """The runner `harness run` or `harness bench` asked for: IsolatedRunner with --isolate (decided by
    run_report.isolate_by_default), else InProcessRunner (`bench` then times in this process instead)."""
    if getattr(args, "isolate", False):
        timeout = args.case_timeout if getattr(args, "case_timeout", None) else DEFAULT_CASE_TIMEOUT_S
        return IsolatedRunner(device, args.seed, args.oracle, getattr(args, "time", False), case_timeout=timeout)
    return InProcessRunner(device, args.seed, args.oracle, args.time)


# ----------------------------------------------------------------------------- the worker side


def _send(stream, message: dict) -> None:
    stream.write(json.dumps(message) + "\n")
    stream.flush()


def _adopt(module_name: str) -> None:
    """Import a backend module and register the Backends it defines (register=False ones too)."""
    import importlib

    from harness.registry import BACKENDS, Backend, register_backend

    before = set(BACKENDS)
    module = importlib.import_module(module_name)
    for obj in vars(module).values():
        if isinstance(obj, Backend) and BACKENDS.get(obj.name) is not obj:
            register_backend(obj)
    for name in set(BACKENDS) - before:  # as discover() records it: the rows' repro commands read it
        BACKENDS[name].origin = BACKENDS[name].origin or module_name


def _resolve(job: dict):
    from harness.registry import BACKENDS

    if job["backend"] not in BACKENDS:
        _adopt(job["module"])
    impls = BACKENDS[job["backend"]].impls
    return impls[(job["op"], job["variant"])]


_CASES: dict = {}


def _case(spec: dict):
    """One Case object per case, so the runner's oracle cache serves every implementation of it."""
    from cases.registry import from_json

    key = json.dumps(spec, sort_keys=True)
    if key not in _CASES:
        if len(_CASES) > 16:
            _CASES.clear()
        _CASES[key] = from_json(spec, "isolate")
    return _CASES[key]


def worker_main() -> int:
    import faulthandler
    import traceback

    protocol = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # backends' prints (Python and C) go to the stderr log, never into the protocol
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for stacks before a timeout kill
    from harness.registry import load_ops

    # TRITON_INTERPRET comes with the parent's environment (set there before any backend
    # loaded); deciding it here would import torch at every worker start.
    load_ops()
    _send(protocol, {"ready": os.getpid()})
    for name in filter(None, os.environ.pop(WARM_ENV, "").split(",")):  # a prestarted worker: before any job
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - only a head start; the backend that needs it will say what is wrong
            pass
    for line in sys.stdin:
        if not line.strip():
            continue
        job = json.loads(line)
        try:
            impl, case = _resolve(job), _case(job["case"])
            impl.backend.unavailable_reason(job["device"])  # import and build before the case's clock starts
            if "bench" in job:  # `harness bench`: the case's inputs and oracle are prepared here, before the clock
                from harness import bench

                call = bench.in_worker(impl, case, job["bench"])
            else:
                def call(impl=impl, case=case, job=job):
                    return {"result": run_case(impl, case, job["device"], job["seed"], job["oracle"],
                                               timed=job["timed"]).to_json()}
            _send(protocol, {"started": True})
            reply = call()
            row = reply["result"]
            sticky = row.get("status") == status.ERROR and sticky_cuda_error(row.get("reason") or "")
            if sticky:  # bench_pair keeps every exception as the row's reason: the context is gone all the same
                _send(protocol, {"error": row["reason"], "sticky": sticky})
                os._exit(STICKY_EXIT)
            _send(protocol, reply)
        except Exception as exc:  # noqa: BLE001 - reported as the case's ERROR (or CRASH when sticky)
            sticky = sticky_cuda_error(exc)
            _send(protocol, {"error": f"{type(exc).__name__}: {exc}", "sticky": sticky,
                             "traceback": traceback.format_exc().strip().splitlines()[-5:-1]})
            if sticky:
                os._exit(STICKY_EXIT)  # the context is gone; exit without CUDA teardown
    return 0


if __name__ == "__main__":
    sys.exit(worker_main())
