"""Benchmark results, reported: one module per job, all reading the results document that
`harness bench` writes (schema "gradoracle-bench/1", harness/report/files.py).

    files          results.json: its schema, load, write (results.json, report.md, plots/ of a run)
    figures        per row: GB/s, % of the ceilings and of the binding one, TFLOP/s, host-bound,
                   IMPOSSIBLE flags, speedup against the baseline and against a variant ladder's first variant
    text           the lines and cells both markdown reports share (device, clocks, ceilings,
                   timing rules, number formats, the variant-ladder table)
    cells          the table cells of the figures beside the time: loop figure and host-bound mark,
                   binding ceiling, peak extra memory, IMPOSSIBLE flags; bench's closing table
    markdown       report.md of one run
    benchmarks_md  the generated block of BENCHMARKS.md, spliced between its markers
    plots          a roofline per op and GB/s bars per case (matplotlib, Agg)
    compare        run-to-run verdicts: FASTER / SLOWER / SAME / AMBIGUOUS
"""
