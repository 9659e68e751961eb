"""results.json of a bench run (schema "gradoracle-bench/1"): everything a report is made from, so
every report can be regenerated from it (`bench --from results.json`):

  command, created, device, versions, ceilings (harness/ceilings.py), config (timing
  rules), clock, ops (each op's cost model), elapsed_s, interrupted, and rows: one per
  (op, case, impl), the JSON of a harness.results.CaseResult with the bench's keys (status,
  reason, outputs (the re-validation), cost {bytes, flops}, timing (harness.timing.Samples.to_json():
  median, min, max, p10/p25/p75/p90, the 95% CI of the median, samples, dropped (throttled)
  samples, mode, clocks, warm-up) and figures (harness/report/figures.py).
"""
from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

from harness.report.markdown import markdown
from harness.report.plots import plot

SCHEMA = "gradoracle-bench/1"


def write(results: dict, outdir, plots: bool = True) -> dict:
    """DIR/results.json, DIR/report.md and DIR/plots/*.png; returns their paths."""
    outdir = Path(outdir)
    write_json(results, outdir)
    pngs = plot(results, outdir / "plots") if plots else []
    (outdir / "report.md").write_text(markdown(results, pngs))
    return {"results": outdir / "results.json", "report": outdir / "report.md", "plots": pngs}


def write_json(results: dict, outdir) -> Path:
    """DIR/results.json alone (a bench's checkpoints), written whole through a temporary file, so a
    run killed while writing leaves the previous checkpoint."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    tmp = outdir / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1, default=str))
    os.replace(tmp, outdir / "results.json")
    return outdir / "results.json"


def load(path) -> dict:
    """A results.json (or .json.gz) of `bench`; ValueError if it is not one."""
    raw = Path(path).read_bytes()
    data = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a gradoracle bench results file (schema {data.get('schema')!r}, "
                         f"expected {SCHEMA!r})")
    return data
