"""Many GPUs: `harness run --gpus N`, and pinning pytest-xdist workers (`pytest -n N`).

`harness run --gpus N [selection ...]` starts N workers, each an ordinary `harness run` of the
same selection with `--shard k/N --seed S --device D --json <worker-k.json>` (all other
options passed through, --isolate included) and with CUDA_VISIBLE_DEVICES set to the k-th
visible GPU in its environment, so the pin is in place before anything in it touches CUDA.
Their rows are relayed as they come, then merged into one report and one JSON in the
order a single run would give (resumed rows first, then by op and case), each row with
"gpu" (the CUDA_VISIBLE_DEVICES entry its worker had; null on the CPU) and "worker" (k).
The merged JSON has a single run's keys plus "workers" (per worker: gpu, shard, exit
status, counts).  The exit status is 0 only if every case passed and every worker
finished; 3 if a worker stopped on a lost CUDA context (harness/isolate.py).  With
`--device cpu` the N workers are CPU processes (CI tests the merge that way); every worker
uses the same seed, so the verdicts equal a single run's.

SIGTERM or Ctrl-C: the workers get SIGTERM (each saves what it finished), the partial
results are merged and saved, marked "interrupted".  With --json the merged file is
rewritten every CHECKPOINT_S seconds from the workers' own checkpoints.

GPUs are counted without initialising CUDA in this process: the entries of
CUDA_VISIBLE_DEVICES when it is set, else NVML's device count (nvidia-ml-py).

`pytest -n N` (pytest-xdist): conftest.py calls `pin_xdist_worker()` first thing, so worker
gwK sees only GPU K mod (number of GPUs).  Backends found through GRADORACLE_BACKENDS are
found by the workers too (they inherit the environment).  At the end of such a session the
controller prints "GPU per worker": each worker's pin, what torch saw there (device count, name,
UUID) and its test outcomes (`xdist_pin_report`, registered by conftest.py).

Checking a split run: `python -m harness.multi_gpu compare ONE.json TWO.json [--wall-one S
--wall-two S] [--json OUT]` compares a single run with a `--gpus N` run of the same selection and
seed (same (op, impl, case, dtype) rows, same status on each, rows per GPU and per worker, the
speedup; exit 0 only if identical, complete and spread over every worker), and `compare-junit
A.xml B.xml` two pytest sessions (`pytest -n 2` against `-n 1`, by --junitxml) test by test.
scripts/gpu_multi.sh runs both on a GPU host.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from harness.status import ALL as STATUSES
from harness.status import FAILED, counts, summary


# ----------------------------------------------------------------------------- GPUs and pinning


def nvml_gpu_count() -> int:
    """GPUs on this host according to NVML (no CUDA context); 0 when NVML is unusable."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # noqa: BLE001 - no driver, no library: no GPU to pin
        return 0


def visible_gpus(environ=None, count=nvml_gpu_count) -> list[str]:
    """The GPU ids a worker may be pinned to: CUDA_VISIBLE_DEVICES's entries if set, else '0'..'n-1'."""
    environ = os.environ if environ is None else environ
    if "CUDA_VISIBLE_DEVICES" in environ:
        return [g.strip() for g in environ["CUDA_VISIBLE_DEVICES"].split(",") if g.strip()]
    return [str(i) for i in range(count())]


def pin_xdist_worker(environ=None, count=nvml_gpu_count) -> str | None:
    """Under pytest-xdist (PYTEST_XDIST_WORKER=gwK): set CUDA_VISIBLE_DEVICES to GPU K mod #GPUs.

    Returns the GPU id chosen, or None (not an xdist worker, or no GPU).  Must run before
    torch, cupy or JAX initialise CUDA: conftest.py calls it at import.
    """
    environ = os.environ if environ is None else environ
    worker = environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw") or not worker[2:].isdigit():
        return None
    gpus = visible_gpus(environ, count)
    if not gpus:
        return None
    chosen = gpus[int(worker[2:]) % len(gpus)]
    environ["CUDA_VISIBLE_DEVICES"] = chosen
    if environ is os.environ:
        PINNED.update(worker=worker, gpu=chosen, of=len(gpus))  # for the session's GPU-per-worker summary
    return chosen


PINNED: dict = {}  # what pin_xdist_worker did in this process: worker, gpu, of (how many it chose from)


# ----------------------------------------------------------------------------- the workers' command lines

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
    import re

    return (line.startswith("device=") or line.startswith("status ") or not line.strip()
            or re.match(r"\d+ passed, \d+ failed", line) is not None)


# ----------------------------------------------------------------------------- merging


def _load(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # not written yet, or caught mid-write (workers replace the file atomically)


def merge(worker_jsons: list, pins: list, resumed_rows: list, order: dict) -> list[dict]:
    """One list of rows: the resumed ones, then every worker's new ones in single-run order.

    order: (op, case id) -> rank in the selection.  Each new row gets "gpu" and "worker"."""
    done = {(r["impl"], r["case"]) for r in resumed_rows}
    rows = []
    for k, data in enumerate(worker_jsons):
        for row in (data or {}).get("results", []):
            if (row["impl"], row["case"]) in done:
                continue
            done.add((row["impl"], row["case"]))
            rows.append({**row, "gpu": pins[k], "worker": k})
    rows.sort(key=lambda r: order.get((r["op"], r["case"]), (-1, -1)))  # stable: impl order within a case stays
    return list(resumed_rows) + rows


def _counts(rows: list[dict]) -> dict:
    return counts(r.get("status") for r in rows)


def _selection_order(args) -> dict:
    """(op, case id) -> position in a single run: ops as `run` orders them, then cases in order."""
    from cases import select

    cases = select(args.cases)
    if args.dtype:
        cases = [c for c in cases if c.dtype in args.dtype]
    ops = args.op or sorted({c.op for c in cases})
    op_rank = {op: i for i, op in enumerate(ops)}
    return {(c.op, c.id): (op_rank.get(c.op, len(ops)), i) for i, c in enumerate(cases)}


# ----------------------------------------------------------------------------- the command


def _device(args) -> str:
    from harness import frameworks

    return frameworks.default_device() if args.device == "auto" else args.device


def cmd_gpus(args) -> int:
    """`harness run --gpus N`: see the module docstring."""
    from harness.cli import CHECKPOINT_S, resumed
    from harness.isolate import STICKY_EXIT, exit_description

    n = args.gpus
    if n < 1:
        raise SystemExit(f"error: --gpus expects N >= 1, got {n}")
    if args.shard:
        raise SystemExit("error: --gpus shards the selection itself (worker k runs --shard k/N): drop --shard")
    device = _device(args)
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
    order = _selection_order(args)
    resumed_rows = [r.row for r in resumed(args.resume)[0]]
    workdir = Path(tempfile.mkdtemp(prefix="gradoracle-gpus-"))
    paths = [workdir / f"worker-{k}.json" for k in range(n)]
    print(f"device={device} cases={args.cases} seed={args.seed} oracle={args.oracle} "
          f"workers={n} gpus={','.join(p or 'cpu' for p in pins)}")
    print(f"{'status':6} {'op':16} {'impl':16} {'case':48} {'max_rel':>9} {'err/tol':>8} {'time_ms':>9}")
    started = time.time()
    procs, relays = [], []
    for k in range(n):
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        if pins[k] is not None:
            env["CUDA_VISIBLE_DEVICES"] = pins[k]  # before the worker exists: nothing in it sees another GPU
        argv = worker_argv(args, f"{k}/{n}", device, str(paths[k]))
        proc = subprocess.Popen([sys.executable, "-m", "harness", *argv], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, env=env, text=True, bufsize=1)
        procs.append(proc)
        relays.append(_Relay(k, proc.stdout))
        relays[-1].start()

    def save(state: str | None) -> list[dict]:
        rows = merge([_load(p) for p in paths], pins, resumed_rows, order)
        if args.json:
            _write(args.json, rows, args, device, pins, procs, paths, state)
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
        if p.returncode not in (0, 1):
            how = exit_description(p.returncode)[0]
            notes.append(f"worker {k} ({'gpu ' + pins[k] if pins[k] is not None else 'cpu'}, shard {k}/{n}) {how}"
                         + ("; it stopped on a lost CUDA context" if p.returncode == STICKY_EXIT else "")
                         + ": cases of its shard after its last result did not run (--isolate keeps a run going)")
    if notes and not interrupted:
        interrupted = "incomplete: " + "; ".join(notes)
    rows = save(interrupted)
    counts = _counts(rows)
    for note in notes:
        print(note, file=sys.stderr)
    failed = sum(counts[s] for s in FAILED)
    print(summary(counts, time.time() - started, f" ({n} workers)"))
    for path in paths:
        path.unlink(missing_ok=True)
    workdir.rmdir()
    if any(p.returncode == STICKY_EXIT for p in procs):
        return STICKY_EXIT
    return 1 if failed or interrupted else 0


def _write(path: str, rows: list[dict], args, device: str, pins: list, procs: list, paths: list,
           state: str | None) -> None:
    """The merged JSON: a single run's keys (taken from the first worker that wrote any) plus "workers"."""
    first = next((d for d in map(_load, paths) if d), {})
    workers = []
    for k, (p, wpath) in enumerate(zip(procs, paths)):
        data = _load(wpath) or {}
        workers.append({"worker": k, "gpu": pins[k], "shard": f"{k}/{len(procs)}", "exit_code": p.poll(),
                        "counts": data.get("counts"), "interrupted": data.get("interrupted")})
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({
        "device": device, "device_name": first.get("device_name"), "cases": args.cases, "seed": args.seed,
        "oracle": args.oracle, "versions": first.get("versions"), "counts": _counts(rows), "interrupted": state,
        "gpus": len(procs), "workers": workers, "results": rows}, indent=1))
    tmp.replace(path)


# ----------------------------------------------------------------------------- checking a split run against one process
# `python -m harness.multi_gpu compare ONE.json TWO.json` (scripts/gpu_multi.sh uses it): the
# rows of a `--gpus N` run against a single run of the same selection and seed.


def load_results(path) -> dict:
    """A results JSON of `harness run` (plain or .gz)."""
    import gzip

    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def row_key(row: dict) -> tuple:
    return (row["op"], row["impl"], row["case"], row.get("dtype"))


def _figures(row: dict) -> list:
    """Per output: passed, max_rel, worst_ratio; equal when the same inputs gave the same bits."""
    return [(o.get("name"), o.get("passed"), o.get("max_rel"), o.get("worst_ratio")) for o in row.get("outputs") or []]


def compare_runs(one: dict, two: dict, wall_one: float | None = None, wall_two: float | None = None) -> dict:
    """`one` (a single run) against `two` (a --gpus run): same rows, same verdicts, and how the rows spread.

    The verdict `ok` needs: both runs complete (not interrupted, every worker exited 0 or 1), the
    same set of (op, impl, case, dtype) rows, no row twice, the same status on every row, and
    every worker of `two` holding rows (on a GPU: as many distinct GPUs as workers)."""
    rows1, rows2 = one.get("results", []), two.get("results", [])
    dup1, dup2 = ([k for k, n in Counter(map(row_key, rows)).items() if n > 1] for rows in (rows1, rows2))
    by1, by2 = {row_key(r): r for r in rows1}, {row_key(r): r for r in rows2}
    common = [k for k in by1 if k in by2]
    differ = [(k, by1[k]["status"], by2[k]["status"]) for k in common if by1[k]["status"] != by2[k]["status"]]
    same_figures = sum(_figures(by1[k]) == _figures(by2[k]) for k in common)

    def spread(field: str) -> dict:
        rows, cases = {}, {}
        for r in rows2:
            at = "none" if r.get(field) is None else str(r.get(field))
            rows[at] = rows.get(at, 0) + 1
            cases.setdefault(at, set()).add((r["op"], r["case"]))
        return {at: {"rows": n, "cases": len(cases[at])} for at, n in sorted(rows.items())}

    workers = two.get("workers") or []
    n_workers = two.get("gpus") or len(workers)
    per_gpu, per_worker = spread("gpu"), spread("worker")
    gpus_used = sorted(g for g in per_gpu if g != "none")
    on_gpu = str(two.get("device", "")).startswith("cuda")
    split = n_workers >= 2 and len([w for w in per_worker if w != "none"]) == n_workers \
        and (not on_gpu or len(gpus_used) == n_workers)
    incomplete = [f"{name}: {data.get('interrupted')}" for name, data in (("one", one), ("two", two))
                  if data.get("interrupted")]
    incomplete += [f"two: worker {w.get('worker')} exit status {w.get('exit_code')}" for w in workers
                   if w.get("exit_code") not in (0, 1)]
    identical = not differ and not dup1 and not dup2 and set(by1) == set(by2)
    speedup = wall_one / wall_two if wall_one and wall_two else None
    # one cut short, two complete: one would have taken longer, so the speedup is at least this
    lower_bound = bool(speedup and one.get("interrupted") and not two.get("interrupted"))
    return {
        "ok": identical and split and not incomplete,
        "identical": identical, "split": split, "incomplete": incomplete,
        "rows_one": len(rows1), "rows_two": len(rows2), "common": len(common),
        "only_in_one": [list(k) for k in by1 if k not in by2],
        "only_in_two": [list(k) for k in by2 if k not in by1],
        "duplicates_one": [list(k) for k in dup1], "duplicates_two": [list(k) for k in dup2],
        "status_differs": [[*k, s1, s2] for k, s1, s2 in differ],
        "same_error_figures": same_figures,
        "counts_one": _counts(rows1), "counts_two": _counts(rows2),
        "seeds": [one.get("seed"), two.get("seed")], "device": two.get("device"),
        "device_name": [one.get("device_name"), two.get("device_name")],
        "workers": n_workers, "gpus_used": gpus_used, "per_gpu": per_gpu, "per_worker": per_worker,
        "worker_exit": [w.get("exit_code") for w in workers],
        "wall_one_s": wall_one, "wall_two_s": wall_two, "speedup": speedup, "speedup_is_lower_bound": lower_bound,
    }


def format_comparison(c: dict, show: int = 20) -> str:
    """The comparison as the lines of a summary."""
    yes = lambda b: "yes" if b else "NO"  # noqa: E731
    lines = [f"rows: one {c['rows_one']}, two {c['rows_two']}, in both {c['common']}; seeds {c['seeds']}",
             f"verdicts identical: {yes(c['identical'])} ({len(c['status_differs'])} status differences, "
             f"{len(c['only_in_one'])} rows only in one, {len(c['only_in_two'])} only in two, "
             f"{len(c['duplicates_one']) + len(c['duplicates_two'])} duplicated); error figures bit-equal on "
             f"{c['same_error_figures']}/{c['common']} rows",
             "counts one: " + ", ".join(f"{s} {n}" for s, n in c["counts_one"].items() if n),
             "counts two: " + ", ".join(f"{s} {n}" for s, n in c["counts_two"].items() if n),
             f"split over {c['workers']} workers: {yes(c['split'])}; device {c['device']}, "
             f"GPUs used {','.join(c['gpus_used']) or '-'}; worker exit statuses {c['worker_exit']}"]
    for field in ("per_gpu", "per_worker"):
        lines.append(f"  {field.replace('_', ' ')}: " + "; ".join(
            f"{at}: {v['rows']} rows, {v['cases']} cases" for at, v in c[field].items()))
    if c["wall_one_s"] and c["wall_two_s"]:
        lines.append(f"wall: one {c['wall_one_s']:.1f}s, two {c['wall_two_s']:.1f}s, speedup "
                     f"{'at least ' if c.get('speedup_is_lower_bound') else ''}{c['speedup']:.2f}x")
    for note in c["incomplete"]:
        lines.append(f"INCOMPLETE {note}")
    for label, key in (("status differs", "status_differs"), ("only in one", "only_in_one"),
                       ("only in two", "only_in_two"), ("duplicated in one", "duplicates_one"),
                       ("duplicated in two", "duplicates_two")):
        for item in c[key][:show]:
            lines.append(f"  {label}: {' | '.join(map(str, item))}")
        if len(c[key]) > show:
            lines.append(f"  {label}: ... {len(c[key]) - show} more")
    lines.append(f"verdict: {'OK' if c['ok'] else 'NOT OK'}")
    return "\n".join(lines)


def read_junit(path) -> dict:
    """test id (classname::name) -> passed | failed | error | skipped, from a pytest --junitxml file."""
    import xml.etree.ElementTree as ET

    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = {child.tag for child in case}
        outcome = ("error" if "error" in kinds else "failed" if "failure" in kinds
                   else "skipped" if "skipped" in kinds else "passed")
        out[f"{case.get('classname')}::{case.get('name')}"] = outcome
    return out


def compare_junit(a: dict, b: dict) -> dict:
    """Two pytest sessions' outcomes (read_junit): the counts and the tests whose outcome differs."""
    def counts(d):
        return {k: sum(v == k for v in d.values()) for k in ("passed", "failed", "error", "skipped")}

    differ = sorted((t, a.get(t, "absent"), b.get(t, "absent")) for t in set(a) | set(b) if a.get(t) != b.get(t))
    return {"same": not differ, "counts_a": counts(a), "counts_b": counts(b), "differ": [list(d) for d in differ]}


# ----------------------------------------------------------------------------- pytest -n N: which GPU each worker had


def xdist_pin_report():
    """A pytest plugin (conftest.py registers it): each xdist worker reports its pin (PINNED), what
    torch saw there (device count, name, UUID; only if the tests initialised CUDA) and its test
    outcomes; the controller prints them at the end, one line a worker, under "GPU per worker"."""
    import pytest

    class XdistPinReport:
        def __init__(self):
            self.outcomes: dict = {}
            self.workers: dict = {}

        def pytest_runtest_logreport(self, report):
            if hasattr(report, "node"):  # the controller's copy of a worker's report: counted there
                return
            if report.when == "call" or (report.when == "setup" and not report.passed) or \
                    (report.when == "teardown" and report.failed):
                outcome = "error" if report.when != "call" and report.failed else report.outcome
                self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

        def pytest_sessionfinish(self, session):
            output = getattr(session.config, "workeroutput", None)
            if output is not None:  # an xdist worker: hand the controller what it needs
                output["gradoracle_pin"] = {**worker_gpu_info(), "outcomes": dict(self.outcomes)}

        @pytest.hookimpl(optionalhook=True)
        def pytest_testnodedown(self, node, error):
            info = getattr(node, "workeroutput", {}).get("gradoracle_pin")
            if info:
                self.workers[info.get("worker") or str(node.gateway.id)] = info

        def pytest_terminal_summary(self, terminalreporter):
            if not self.workers:
                return
            terminalreporter.write_sep("-", "gradoracle: GPU per worker")
            for line in pin_summary_lines(self.workers):
                terminalreporter.write_line(line)

    return XdistPinReport()


def worker_gpu_info(environ=None) -> dict:
    """This process's pin and, when torch has initialised CUDA here, what it sees."""
    environ = os.environ if environ is None else environ
    info = {"worker": environ.get("PYTEST_XDIST_WORKER"), "pinned": PINNED.get("gpu"), "of": PINNED.get("of"),
            "cuda_visible_devices": environ.get("CUDA_VISIBLE_DEVICES")}
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            props = torch.cuda.get_device_properties(0)
            info.update(torch_devices=torch.cuda.device_count(), name=props.name,
                        uuid=str(getattr(props, "uuid", "")) or None, pci_bus_id=getattr(props, "pci_bus_id", None))
    except Exception as exc:  # noqa: BLE001 - a report line must not fail the session
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def pin_summary_lines(workers: dict) -> list[str]:
    """One line a worker ('gw0: GPU 0 of 2 (CUDA_VISIBLE_DEVICES=0), torch sees 1: NAME uuid ...; N tests: ...'),
    then how many distinct GPUs the workers had."""
    lines, seen = [], set()
    for name in sorted(workers, key=lambda w: (len(w), w)):
        info = workers[name]
        pin = (f"GPU {info['pinned']} (of {info['of']} visible)" if info.get("pinned") is not None else "no GPU pinned")
        line = f"{name}: {pin} (CUDA_VISIBLE_DEVICES={info.get('cuda_visible_devices')})"
        if info.get("torch_devices") is not None:
            line += f", torch sees {info['torch_devices']}: {info.get('name')} uuid {info.get('uuid')}"
            seen.add(info.get("uuid") or info.get("pinned"))
        elif info.get("pinned") is not None:
            seen.add(info["pinned"])
        outcomes = info.get("outcomes") or {}
        line += f"; {sum(outcomes.values())} tests: " + ", ".join(f"{n} {k}" for k, n in sorted(outcomes.items()))
        lines.append(line)
    lines.append(f"{len(workers)} workers on {len(seen)} distinct GPU(s)")
    return lines


# ----------------------------------------------------------------------------- python -m harness.multi_gpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.multi_gpu",
                                     description="check a `harness run --gpus N` against a single run, or two "
                                                 "pytest sessions (-n N against -n 1) by their --junitxml files")
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("compare", help="ONE (single run) against TWO (--gpus run) of the same selection and seed")
    c.add_argument("one")
    c.add_argument("two")
    c.add_argument("--wall-one", type=float, help="seconds the single run took (for the speedup)")
    c.add_argument("--wall-two", type=float, help="seconds the --gpus run took")
    c.add_argument("--json", help="write the comparison here")
    c.add_argument("--show", type=int, default=20, help="list at most this many differing rows of each kind")
    j = sub.add_parser("compare-junit", help="two pytest --junitxml files: same outcome for every test?")
    j.add_argument("a")
    j.add_argument("b")
    j.add_argument("--show", type=int, default=20)
    args = parser.parse_args(argv)
    if args.command == "compare":
        result = compare_runs(load_results(args.one), load_results(args.two), args.wall_one, args.wall_two)
        print(format_comparison(result, args.show))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=1))
        return 0 if result["ok"] else 1
    result = compare_junit(read_junit(args.a), read_junit(args.b))
    print(f"{args.a}: " + ", ".join(f"{n} {k}" for k, n in result["counts_a"].items()))
    print(f"{args.b}: " + ", ".join(f"{n} {k}" for k, n in result["counts_b"].items()))
    for t, a, b in result["differ"][:args.show]:
        print(f"  differs: {t}: {a} / {b}")
    print(f"same outcome for every test: {'yes' if result['same'] else 'NO'} ({len(result['differ'])} differ)")
    return 0 if result["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
