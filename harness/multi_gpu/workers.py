"""The `harness run --gpus N` driver: N workers, each `harness run --shard k/N` of the same selection
pinned to one GPU (CUDA_VISIBLE_DEVICES set before it starts), their output relayed row by row,
their results merged (harness/multi_gpu/merge.py) into one report, one JSON and one exit status."""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import frameworks
from harness.isolate import STICKY_EXIT, exit_description
from harness.multi_gpu.gpus import visible_gpus
from harness.multi_gpu.merge import load, merge, selection_order, write
from harness.results import CHECKPOINT_S, CaseResult, resumed
from harness.run_report import NOTHING_RAN_EXIT, nothing_ran
from harness.status import ALL as STATUSES
from harness.status import FAILED, counts, summary


_OWN = {"gpus", "json", "shard", "seed", "device", "run_parser", "help"}  # set per worker, or not passed on


def worker_argv(args, shard: str, device: str, json_path: str) -> list[str]:
    """`harness run` arguments of one worker: every option the user gave, re-spelled from the
    parsed arguments (so options added later pass through too), plus its shard, seed, device, JSON."""
    out = ["run"]
    for action in args.run_parser._actions:
        if not action.option_strings or action.dest in _OWN:
            continue
        flag, value = action.option_strings[0], getattr(args, action.dest, None)
        if isinstance(action, argparse._StoreTrueAction):
            out += [flag] if value else []
        elif isinstance(action, argparse._StoreFalseAction):
            out += [] if value else [flag]
        elif isinstance(action, argparse._CountAction):
            out += [flag] * (value or 0)
        elif isinstance(action, argparse._AppendAction):
            for item in value or []:
                out += [flag, str(item)]
        elif value is not None and value != action.default:
            out += [flag, str(value)]
    return out + ["--shard", shard, "--seed", str(args.seed), "--device", device, "--json", json_path]


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def worker_env(pin: str | None, n: int, environ=None, cpus: int | None = None) -> dict:
    """One worker's environment: the caller's, its GPU pin, and the host's cores shared out among the
    n workers for BLAS/OpenMP (the float64 oracle passes are numpy matmuls).  Four processes on 2
    cores, each starting a thread per core, took 6.3 s a conv case against 1.2 s with one thread each
    (10.0 s against 4.9 s for the four).  A thread count the user set is kept."""
    env = dict(os.environ if environ is None else environ, PYTHONUNBUFFERED="1")
    if pin is not None:
        env["CUDA_VISIBLE_DEVICES"] = pin  # before the worker exists: nothing in it sees another GPU
    if not any(v in env for v in THREAD_VARS):
        share = str(max(1, (cpus or os.cpu_count() or 1) // n))
        env.update(dict.fromkeys(THREAD_VARS, share))
    return env


# ----------------------------------------------------------------------------- relaying their output


class _Relay(threading.Thread):
    """Prints one worker's output a row at a time (a row and its indented detail lines stay
    together); its header and summary lines are dropped, since the merged run prints its own."""

    lock = threading.Lock()

    def __init__(self, k: int, stream):
        super().__init__(daemon=True)
        self.k, self.stream = k, stream

    def run(self):
        block: list[str] = []
        for line in self.stream:
            line = line.rstrip("\n")
            if line[:1].isspace() and block:
                block.append(line)
                continue
            self._flush(block)
            block = [line]
        self._flush(block)

    def _flush(self, block: list[str]) -> None:
        if not block or _is_frame(block[0]):
            return
        is_row = block[0].split(" ", 1)[0] in STATUSES
        with self.lock:
            for line in block:
                print(line if is_row else f"[worker {self.k}] {line}")
            sys.stdout.flush()


def _is_frame(line: str) -> bool:
    """A worker's own header or summary line."""
    return (line.startswith("device=") or line.startswith("status ") or not line.strip()
            or re.match(r"\d+ passed, \d+ failed", line) is not None)


# ----------------------------------------------------------------------------- the command


def cmd_gpus(args) -> int:
    """`harness run --gpus N`: see harness/multi_gpu/__init__.py."""
    n = args.gpus
    if n < 1:
        raise SystemExit(f"error: --gpus expects N >= 1, got {n}")
    if args.shard:
        raise SystemExit("error: --gpus shards the selection itself (worker k runs --shard k/N): drop --shard")
    device = frameworks.default_device() if args.device == "auto" else args.device
    if device.startswith("cuda"):
        gpus = visible_gpus()
        if len(gpus) < n:
            raise SystemExit(f"error: --gpus {n}: only {len(gpus)} GPU(s) visible"
                             + (f" (CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']})"
                                if "CUDA_VISIBLE_DEVICES" in os.environ else ""))
        pins = gpus[:n]
    else:
        pins = [None] * n
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    order = selection_order(args)
    resumed_rows = [r.to_json() for r in resumed(args.resume)[0]]
    workdir = Path(tempfile.mkdtemp(prefix="gradoracle-gpus-"))
    paths = [workdir / f"worker-{k}.json" for k in range(n)]
    print(f"device={device} cases={args.cases} seed={args.seed} oracle={args.oracle} "
          f"workers={n} gpus={','.join(p or 'cpu' for p in pins)}")
    print(f"{'status':6} {'op':16} {'impl':16} {'case':48} {'max_rel':>9} {'err/tol':>8} {'time_ms':>9}")
    started = time.time()
    procs, relays = [], []
    for k in range(n):
        env = worker_env(pins[k], n)
        argv = worker_argv(args, f"{k}/{n}", device, str(paths[k]))
        proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
        procs.append(proc)
        relays.append(_Relay(k, proc.stdout))
        relays[-1].start()

    def save(state: str | None) -> list[dict]:
        rows = merge([load(p) for p in paths], pins, resumed_rows, order)
        if args.json:
            write(args.json, rows, args, device, pins, procs, paths, state)
        return rows

    interrupted, saved = None, time.time()
    try:
        while any(p.poll() is None for p in procs):
            time.sleep(0.2)
            if time.time() - saved > CHECKPOINT_S:
                save("checkpoint (the run did not finish)")
                saved = time.time()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: every worker saves what it finished
        interrupted = "interrupted"
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    for relay in relays:
        relay.join(5)
    notes = []
    for k, p in enumerate(procs):
        if p.returncode not in (0, 1, NOTHING_RAN_EXIT):  # 5: its shard was all skipped, a complete run
            how = exit_description(p.returncode)[0]
            notes.append(f"worker {k} ({'gpu ' + pins[k] if pins[k] is not None else 'cpu'}, shard {k}/{n}) {how}"
                         + ("; it stopped on a lost CUDA context" if p.returncode == STICKY_EXIT else "")
                         + ": cases of its shard after its last result did not run (--isolate keeps a run going)")
    if notes and not interrupted:
        interrupted = "incomplete: " + "; ".join(notes)
    rows = save(interrupted)
    tally = counts(r.get("status") for r in rows)
    for note in notes:
        print(note, file=sys.stderr)
    failed = sum(tally[s] for s in FAILED)
    print(summary(tally, time.time() - started, f" ({n} workers)"))
    for path in paths:
        path.unlink(missing_ok=True)
    workdir.rmdir()
    if any(p.returncode == STICKY_EXIT for p in procs):
        return STICKY_EXIT
    if failed or interrupted:
        return 1
    return nothing_ran([CaseResult.from_json(r) for r in rows])
