"""`python -m harness` (also `gradoracle`): list what is registered, run cases, exit non-zero on failure;
`bench`, `compare` and `ceilings` time implementations (harness/bench_cli.py); `mutate` scores the
cases against planted near-miss kernels (harness/mutate.py)."""
from __future__ import annotations

import argparse
import functools
import random
import signal
import sys
import time

from harness import bench_cli, frameworks, mutate, run_report, status
from harness.registry import BACKENDS, BROKEN, BROKEN_OPS, discover, is_baseline, load_ops
from harness.results import CHECKPOINT_S, resumed, write_run
from harness.selection import SelectionError, select


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="ops, backends (with availability), variants and case sets")
    run = sub.add_parser("run", help="check implementations against the oracle")
    run.add_argument("--op", action="append", help="op name (repeatable); default: all")
    run.add_argument("--backend", action="append",
                     help="backend or backend@variant (repeatable); default: every available one")
    run.add_argument("--cases", "--case", dest="cases", default="smoke",
                     help="smoke | full | perf | stress | all | FILE.json|yaml | JSON case (--case '<json>' too)")
    run.add_argument("--dtype", action="append", help="f32 | f16 | bf16 | f64 (repeatable)")
    run.add_argument("--device", default="auto", help="cpu | cuda | auto (cuda when a GPU is visible)")
    run.add_argument("--seed", type=int, default=None,
                     help="run seed, mixed with each case id (default: fresh each run, printed)")
    run.add_argument("--oracle", default="auto", choices=("auto", "numpy", "jax"),
                     help="auto (default): numpy, or JAX (jit, x64) on the GPU for cases over 1 GiB of float64 "
                          "inputs or 1e11 flops")
    run.add_argument("--time", action="store_true",
                     help="also time each passing call (timing engine, hot mode, small budget) and re-validate it")
    run.add_argument("--repeat", type=int, default=None, metavar="N",
                     help="call each implementation N times on the same inputs: bitwise equal if deterministic, "
                          "else the spread is reported (default: 2 for cases up to 64 MiB, else 1; harness/runner.py)")
    run.add_argument("--json", help="write every result to this JSON file")
    run.add_argument("--shard", metavar="K/N", help="run only cases K, K+N, K+2N, ... (0 <= K < N) of the selection")
    run.add_argument("--resume", metavar="RESULTS.json",
                     help="take the results of an earlier (e.g. interrupted) run and run only what it lacks")
    run.add_argument("--isolate", action="store_true",
                     help="run each case in a worker subprocess (reused, replaced when it dies): a crash or hang "
                          "marks that case CRASH or TIMEOUT and the run goes on (the default whenever an "
                          "implementation other than the baselines of backends/baselines/ is selected)")
    run.add_argument("--no-isolate", action="store_true",
                     help="run every case in this process, even kernels under test (a crash ends the run)")
    run.add_argument("--case-timeout", type=float, default=None, metavar="S",
                     help="with --isolate: seconds a case may run before it is TIMEOUT (default 300); "
                          "with --sanitize: seconds per backend (default 900)")
    run.add_argument("--sanitize", choices=("memcheck", "racecheck", "initcheck", "synccheck"),
                     help="run each CUDA backend's cases (default: smoke) under NVIDIA compute-sanitizer with this "
                          "tool, one process per backend; report clean or its errors (harness/sanitize.py)")
    run.add_argument("--gpus", type=int, default=None, metavar="N",
                     help="spread the cases over N worker processes, one per GPU (CUDA_VISIBLE_DEVICES; N CPU "
                          "workers with --device cpu), and merge their results (harness/multi_gpu/)")
    run.add_argument("--show-skips", action="store_true", help="print skipped rows too, with their reasons")
    run.add_argument("-v", "--verbose", action="store_true", help="print every output's error line")
    run.set_defaults(run_parser=run)  # --gpus rebuilds its workers' command lines from it
    bench_cli.add_parsers(sub)
    from harness import profile

    profile.add_parser(sub)
    mutate.add_parser(sub)
    from harness import describe, merge

    describe.add_parser(sub)
    merge.add_parser(sub)
    return parser.parse_args(argv)


def cmd_list() -> int:
    from cases import all_cases
    from cases.registry import BROKEN as BROKEN_CASES

    ops = load_ops()
    discover()
    device = frameworks.default_device()
    print(f"ops ({len(ops)}):")
    for name, spec in sorted(ops.items()):
        print(f"  {name}: inputs {', '.join(spec.inputs)} -> outputs {', '.join(spec.outputs)}")
        print(f"    params: " + "; ".join(f"{k} = {v}" for k, v in spec.params.items()))
    print(f"\nbackends (default device here: {device}):")
    heading = None
    for be in sorted(BACKENDS.values(), key=lambda b: (not is_baseline(b), b.name)):
        group = ("baselines, the libraries a kernel competes with (backends/baselines/)" if is_baseline(be)
                 else "kernel backends (backends/, entry points, $GRADORACLE_BACKENDS)")
        if group != heading:
            heading = group
            print(f" {group}:")
        state = []
        for dev in be.devices:
            reason = be.unavailable_reason(dev)
            state.append(f"{dev}: {'available' if reason is None else 'unavailable (' + reason + ')'}")
        print(f"  {be.name} [{be.framework}] {be.description}")
        print(f"    " + "; ".join(state))
        for (op, variant), impl in sorted(be.impls.items()):
            flags = [f for f, on in (("baseline", impl.baseline), ("deterministic", impl.deterministic)) if on]
            print(f"    {op}: {impl.id} dtypes={','.join(impl.dtypes)} devices={','.join(impl.devices)}"
                  + (f" ({', '.join(flags)})" if flags else ""))
    for name, reason in sorted(BROKEN.items()):
        print(f"  {name}: unavailable ({reason})")
    for name, reason in sorted(BROKEN_OPS.items()):
        print(f"  op {name}: unavailable ({reason})")
    print("\ncase sets:")
    every = all_cases()
    for op in sorted(ops):
        counts = {t: sum(1 for c in every if c.op == op and t in c.tags) for t in ("smoke", "full", "perf", "stress")}
        print(f"  {op}: " + ", ".join(f"{t}={n}" for t, n in counts.items()))
    for module, reason in sorted(BROKEN_CASES.items()):
        print(f"  cases of {module}: unavailable ({reason})")
    print("  (or --cases FILE.json / FILE.yaml, or --cases '<json case>')")
    return 0


def cmd_run(args) -> int:
    from harness import isolate

    if args.repeat is not None:  # run_case reads it from the environment, so --isolate/--gpus workers see it too
        import os

        from harness.runner import REPEAT_ENV

        if args.repeat < 1:
            raise SystemExit(f"error: --repeat expects N >= 1, got {args.repeat}")
        os.environ[REPEAT_ENV] = str(args.repeat)
    if args.sanitize:
        from harness import sanitize

        return sanitize.cmd_sanitize(args)
    if args.gpus:
        from harness.multi_gpu.workers import cmd_gpus

        return cmd_gpus(args)
    discover()
    named_broken = run_report.import_failures(args.backend)
    device = args.device if args.device != "auto" else getattr(args, "default_device", None) or \
        frameworks.default_device()
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1 << 31)
    try:  # op by op as printed; an unknown backend name or a bad --shard is an error
        pairs = select(args.cases, args.op, args.dtype, args.backend, shard_spec=args.shard, by_op=True, strict=True)
    except SelectionError as exc:
        raise SystemExit(f"error: {exc}") from None
    if args.isolate and args.no_isolate:
        raise SystemExit("error: --isolate and --no-isolate contradict each other")
    args.isolate = run_report.isolate_by_default(args, pairs)
    if not args.isolate:
        isolate.discard_prestarted()
    results, done = resumed(args.resume)
    started = time.time()
    print(f"device={device} cases={args.cases} seed={args.seed} oracle={args.oracle}"
          + (" isolate=worker process" if args.isolate else ""))
    print(run_report.HEADER)
    interrupted, saved = None, time.time()

    def save(state: str | None) -> None:  # the whole file, so a killed run leaves its last checkpoint
        if args.json:
            write_results(args.json, results, device, args, state)

    if args.json:
        _device_name(device)  # now, while CUDA is sure to answer
    runner, stopped = isolate.make_runner(args, device), False  # in this process, or --isolate workers
    try:
        for case, impls in pairs:
            for impl in impls:
                if (impl.id, case.id) in done:
                    continue
                r = runner.run(impl, case)
                results.append(r)
                _print_row(r, args)
                if runner.lost:  # a sticky CUDA error: nothing more can run in this process
                    raise isolate.RunStopped(runner.lost)
                if time.time() - saved > CHECKPOINT_S:
                    save(f"checkpoint after {len(results)} results (the run did not finish)")
                    saved = time.time()
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (e.g. `timeout`): report and save what ran
        interrupted = f"interrupted after {len(results)} results"
        print(f"\n{interrupted}")
    except isolate.RunStopped as stop:
        interrupted, stopped = f"stopped after {len(results)} results: {stop}", True
        print(f"\nSTOPPED: {stop}", file=sys.stderr)
    except Exception:  # an unexpected error: keep what ran, then let it propagate
        save(f"stopped by an exception after {len(results)} results")
        raise
    finally:
        runner.close()
    counts = status.counts(r.status for r in results)
    run_report.print_matrix(results)
    print(status.summary(counts, time.time() - started))
    save(interrupted)
    if stopped:
        return isolate.STICKY_EXIT
    if any(counts[s] for s in status.FAILED) or interrupted or named_broken:
        return 1
    return run_report.nothing_ran(results)


def write_results(path: str, results: list, device: str, args, interrupted: str | None) -> None:
    """The run's --json (harness/results.py): what ran, with the selection and the environment."""
    write_run(path, {"device": device, "device_name": _device_name(device), "cases": args.cases, "seed": args.seed,
                     "oracle": args.oracle, "versions": _versions()}, [r.to_json() for r in results], interrupted)


def _print_row(r, args) -> None:
    if r.status == status.SKIP and not args.show_skips:
        return
    print(run_report.row_line(r))
    if r.status in status.REPRO or args.verbose:
        print("\n".join("       " + line for line in r.report().splitlines()[1:]))
    elif r.status == status.SKIP and r.reason:
        print(f"       {r.reason}")


@functools.lru_cache(maxsize=None)
def _device_name(device: str) -> str:
    """Cached: cmd_run asks before its first case, since after a lost CUDA context torch cannot answer."""
    if device.startswith("cuda"):
        try:
            import torch

            return torch.cuda.get_device_name()
        except Exception as exc:  # noqa: BLE001 - the results must still be saved
            return f"unknown ({type(exc).__name__})"
    import platform

    return platform.processor() or platform.machine()


def _versions() -> dict:
    import importlib.metadata as md

    out = {"python": sys.version.split()[0]}
    for pkg in ("numpy", "torch", "triton", "jax", "jaxlib", "cupy-cuda13x", "cupy-cuda12x"):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return out


def _sigterm_as_interrupt(signum, frame):
    # One-shot: `timeout` signals the whole process group, so a second TERM can arrive while the
    # interrupted run prints and saves what it finished; ignore it rather than lose the save.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt


def main(argv=None) -> int:
    from cases.registry import CaseFileError

    try:
        return _main(argv)
    except CaseFileError as exc:  # a bad case file or --cases value: one line naming entry and param
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _main(argv=None) -> int:
    import os
    import signal

    args = _parse(argv)
    if args.command == "run":
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
        if not (args.no_isolate or args.gpus or args.sanitize):  # likely isolated (harness/isolate.py)
            from harness import isolate

            if isolate.surely_no_gpu():  # the CPU, known without importing torch (its worker will)
                args.default_device = "cpu"
                os.environ.setdefault("TRITON_INTERPRET", "1")  # as interpret_triton_without_gpu decides
            else:
                frameworks.interpret_triton_without_gpu()
                args.default_device = frameworks.default_device()
            isolate.prestart()  # its worker starts now, while this process selects the cases
    if not getattr(args, "default_device", None):
        frameworks.interpret_triton_without_gpu()
    if args.command == "list":
        return cmd_list()
    if args.command in ("bench", "compare", "ceilings"):
        return bench_cli.dispatch(args, argv)
    if args.command == "profile":
        from harness import profile

        return profile.cmd_profile(args)
    if args.command == "mutate":
        return mutate.cmd_mutate(args)
    if args.command in ("describe", "merge"):
        from harness import describe, merge

        return describe.cmd_describe(args) if args.command == "describe" else merge.cmd_merge(args)
    return cmd_run(args)
