"""The `bench`, `compare` and `ceilings` subcommands of `python -m harness` (wired in harness/cli.py).

    python -m harness bench [--op OP] [--backend B[@V]] [--cases perf] [--dtype D] [--mode cold|hot|graph]
                            --report DIR [--benchmarks-md BENCHMARKS.md] [--budget S] [--time-limit S] ...
    python -m harness bench --from DIR/results.json [--from DIR2/results.json ...] [--report DIR3]
                            [--benchmarks-md BENCHMARKS.md]
    python -m harness compare A/results.json B/results.json [--all] [--json OUT]
    python -m harness ceilings [--device D] [--refresh]
"""
from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from harness import frameworks, status, timing


def add_parsers(sub) -> None:
    b = sub.add_parser("bench", help="time implementations (GPU events, adaptive), re-validate, write reports")
    b.add_argument("--op", action="append", help="op name (repeatable); default: all")
    b.add_argument("--backend", action="append", help="backend or backend@variant (repeatable); default: all")
    b.add_argument("--cases", default="perf", help="perf (default) | smoke | full | all | FILE | JSON case")
    b.add_argument("--dtype", action="append", help="f32 | f16 | bf16 | f64 (repeatable)")
    b.add_argument("--device", default="auto", help="cpu | cuda | auto")
    b.add_argument("--seed", type=int, default=0, help="run seed (default 0: the same inputs every run)")
    b.add_argument("--oracle", default="auto", choices=("auto", "numpy", "jax"))
    b.add_argument("--mode", default="cold", choices=timing.MODES,
                   help="cold: L2 flushed before each sample (default); hot: no flush; graph: CUDA-graph replays")
    b.add_argument("--rel-ci", type=float, default=0.005, help="stop at this 95%% CI half-width / median (0.005)")
    b.add_argument("--min-samples", type=int, default=10)
    b.add_argument("--max-samples", type=int, default=500)
    b.add_argument("--budget", type=float, default=1.0, help="sampling seconds per implementation and case (1.0)")
    b.add_argument("--warmup-budget", type=float, default=0.5, help="warm-up seconds after the first call (0.5)")
    b.add_argument("--rotate", type=int, default=0, help="input sets to rotate over (0: auto; see --cold-sets)")
    b.add_argument("--cold-sets", type=int, default=16,
                   help="cold mode: rotate over up to this many input allocations, 512 MiB in all (16)")
    b.add_argument("--graph-calls", type=int, default=0, help="calls per graph replay (0: auto)")
    b.add_argument("--no-hold", action="store_true",
                   help="no GPU spin before each sample: times include the host's launch latency (harness/timing.py)")
    b.add_argument("--loop-calls", type=int, default=0,
                   help="calls per loop of the loop figure (0: auto, about 20 ms of calls; harness/timing.py)")
    b.add_argument("--no-loop", action="store_true", help="no loop figure (back-to-back calls) after the samples")
    b.add_argument("--rest", type=float, default=2.0,
                   help="seconds of idle GPU before a sample set is taken again when all of it ran below 95%% of the "
                        "top SM clock (power cap after a tuner's or an earlier row's load); 0: keep it, marked (2)")
    b.add_argument("--full-validation", action="store_true",
                   help="judge every output element of the final call (default: a 1M sample above 4M elements)")
    b.add_argument("--prefetch", type=int, default=None, help="threads preparing later cases (default: cores/4, <= 4)")
    b.add_argument("--per-op", type=int, default=None, help="at most this many cases of each op")
    b.add_argument("--interleave", action="store_true",
                   help="take the ops in turn (one case of each, then the next), so a time-limited run covers all")
    b.add_argument("--time-limit", type=float, default=None,
                   help="seconds; pairs not started by then are recorded as not run")
    b.add_argument("--isolate", action="store_true",
                   help="time each pair in a worker subprocess (reused, replaced when it dies): a crash or hang "
                        "is that pair's CRASH or TIMEOUT row and the run goes on (the default whenever an "
                        "implementation other than the baselines of backends/baselines/ is selected, as for run)")
    b.add_argument("--no-isolate", action="store_true",
                   help="time every pair in this process, with --prefetch threads (a crash ends the run)")
    b.add_argument("--case-timeout", type=float, default=None, metavar="S",
                   help="isolated: seconds a pair may run, after its case is prepared, before it is TIMEOUT (300)")
    b.add_argument("--report", help="write DIR/results.json, DIR/report.md, DIR/plots/*.png")
    b.add_argument("--benchmarks-md", help="regenerate this BENCHMARKS.md from the results")
    b.add_argument("--plots-link", help="with --benchmarks-md: link the PNGs in this folder from it")
    b.add_argument("--resume", metavar="RESULTS.json",
                   help="an earlier run of this command (e.g. stopped by --time-limit): measure only the pairs "
                        "it did not run, and write both as one results document")
    b.add_argument("--from", dest="from_json", action="append",
                   help="no measuring: regenerate reports from this results.json (repeatable, e.g. one run per op: "
                        "--benchmarks-md takes each op's section from the last run that has it; --report "
                        "merges them as `harness merge` does)")
    b.add_argument("--no-plots", action="store_true")
    b.add_argument("--refresh-ceilings", action="store_true", help="measure the device's ceilings again")
    b.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    c = sub.add_parser("compare", help="FASTER / SLOWER / SAME / AMBIGUOUS per case and impl between two runs")
    c.add_argument("a", help="results.json of the first run")
    c.add_argument("b", help="results.json of the second run (verdicts are B against A)")
    c.add_argument("--all", action="store_true", help="print SAME rows too")
    c.add_argument("--json", help="write the verdicts to this file")
    c.add_argument("--fail-on-slower", action="store_true", help="exit 1 if any verdict is SLOWER")
    e = sub.add_parser("ceilings", help="measure (or show cached) copy bandwidth and matmul TFLOP/s of a device")
    e.add_argument("--device", default="auto")
    e.add_argument("--refresh", action="store_true")
    e.add_argument("--json", help="also write the record to this file")


def dispatch(args, argv) -> int | None:
    if args.command == "bench":
        return cmd_bench(args, argv)
    if args.command == "compare":
        return cmd_compare(args)
    if args.command == "ceilings":
        return cmd_ceilings(args)
    return None


def _command(argv) -> str:
    return "python -m harness " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))


def cmd_bench(args, argv=None) -> int:
    from harness import bench, ceilings, prepared
    from harness.report import benchmarks_md, files

    docs = None
    if args.from_json:
        docs = [files.load(p) for p in args.from_json]
        if len(docs) == 1:
            from harness.report.figures import add_figures

            results = add_figures(docs[0])  # figures (and flags) by today's rules
        else:
            from harness.merge import merge_bench

            results = merge_bench(docs, args.from_json)
    else:
        if not args.report and not args.benchmarks_md:
            raise SystemExit("error: bench needs --report DIR and/or --benchmarks-md FILE")
        from harness import isolate, run_report
        from harness.registry import discover

        if args.isolate and args.no_isolate:
            raise SystemExit("error: --isolate and --no-isolate contradict each other")
        if not args.no_isolate:
            isolate.prestart()  # likely isolated: the worker starts while this process discovers and plans
        discover()
        device = frameworks.default_device() if args.device == "auto" else args.device
        cfg = timing.TimingConfig(mode=args.mode, rel_ci=args.rel_ci, min_samples=args.min_samples,
                                  max_samples=args.max_samples, budget_s=args.budget,
                                  warmup_budget_s=args.warmup_budget, rotate=args.rotate, cold_sets=args.cold_sets,
                                  graph_calls=args.graph_calls, hold=not args.no_hold, loop=not args.no_loop,
                                  loop_calls=args.loop_calls, rest_s=args.rest)
        opts = bench.BenchOptions(device, cfg, args.seed, args.oracle,
                                  None if args.full_validation else prepared.SAMPLE_ABOVE,
                                  bench.default_prefetch() if args.prefetch is None else args.prefetch,
                                  args.time_limit, not args.quiet)
        pairs = bench.plan(args.cases, args.op, args.backend, args.dtype, args.per_op, args.interleave)
        if args.backend and not pairs:
            raise SystemExit(f"error: no implementation named {', '.join(args.backend)} runs the selected cases")
        earlier = None
        if args.resume:
            earlier = files.load(args.resume)
            pairs = bench.left_to_run(pairs, earlier)
        args.isolate = run_report.isolate_by_default(args, pairs)  # the decision `run` makes
        if not args.isolate:
            isolate.discard_prestarted()
        ceil = ceilings.get(device, refresh=args.refresh_ceilings)  # once, here: the rows' figures read it
        print(f"bench: device={device} ({ceil['device']['name']}) cases={args.cases} mode={args.mode} "
              f"pairs={sum(len(i) for _, i in pairs)} seed={args.seed}"
              + (" isolate=worker process" if args.isolate else ""), file=sys.stderr)

        def with_earlier(fresh: dict) -> dict:  # the earlier rows first: its header leads, as in `merge`
            if earlier is None:
                return fresh
            from harness.merge import merge_bench

            joined = merge_bench([earlier, fresh], [args.resume, "this run"])
            joined["interrupted"] = fresh.get("interrupted") or ""  # the earlier run's gaps are this run's pairs
            return joined

        def checkpoint(fresh: dict) -> None:  # DIR/results.json alone: a killed run leaves it for --resume
            files.write_json(with_earlier(fresh), args.report)

        runner = isolate.make_runner(args, device) if args.isolate else None
        try:
            results = bench.run(pairs, opts, ceil, _command(argv), runner, checkpoint if args.report else None)
        finally:
            if runner is not None:
                runner.close()
        results = with_earlier(results)
    written = []
    if args.report:
        out = files.write(results, args.report, plots=not args.no_plots)
        written += [str(out["results"]), str(out["report"])] + [str(p) for p in out["plots"]]
    if args.benchmarks_md:
        written.append(str(benchmarks_md.update_benchmarks_md(docs or results, args.benchmarks_md, args.plots_link)))
    rows = results["rows"]
    counts = status.counts(r["status"] for r in rows)
    for r in rows:
        if r["status"] in status.REPRO:
            print(f"{r['status']} {r['op']} {r['impl']} {r['case']}: {r['reason']}\n  reproduce: {r.get('repro', '')}")
    from harness.report.cells import console

    for line in console(rows):
        print(line)
    flagged = [r for r in rows if r.get("flag")]
    for r in flagged:  # faster than the hardware allows: a timing or cost-model error, not a result
        print(f"IMPOSSIBLE {r['op']} {r['impl']} {r['case']}: {r['flag']}")
    known = "".join(f", {counts[s]} {s.lower()}ed" for s in (status.XFAIL, status.XPASS) if counts[s])
    if flagged:
        known += f", {len(flagged)} impossible (not results)"
    failed = sum(counts[s] for s in status.FAILED)
    crashed = counts[status.CRASH] + counts[status.TIMEOUT]
    print(f"{counts[status.PASS] + counts[status.XPASS]} timed, {failed} failed"
          + (f" ({counts[status.CRASH]} crashed, {counts[status.TIMEOUT]} timed out)" if crashed else "")
          + f", {counts[status.SKIP]} skipped"
          + known
          + (f" in {results.get('elapsed_s')}s" if results.get("elapsed_s") is not None else "")
          + (f" ({results['interrupted']})" if results.get("interrupted") else ""))
    for w in written:
        print(f"wrote {w}")
    stopped = str(results.get("interrupted") or "").startswith(bench.STOPPED) if not docs else False
    return 1 if failed or stopped else 0


def cmd_compare(args) -> int:
    from harness.report import compare, files

    result = compare.compare(files.load(args.a), files.load(args.b))
    print(compare.format_compare(result, args.a, args.b, show_all=args.all))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 1 if args.fail_on_slower and result["summary"]["counts"]["SLOWER"] else 0


def cmd_ceilings(args) -> int:
    from harness import ceilings
    from harness.report.text import ceilings_line

    device = frameworks.default_device() if args.device == "auto" else args.device
    record = ceilings.get(device, refresh=args.refresh)

    print(f"{record['device']['name']}: {ceilings_line({'ceilings': record})}")
    print(f"cache: {record.get('cached')}")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=1))
    return 0
