"""The result row: one implementation on one case (`CaseResult`), the one row type of `run`, `bench`,
the `--isolate` workers and the `--gpus` merge, and the results files `run` writes and reads back.

A row's JSON (`to_json`) holds its fields and then its `extra` keys: what a row of one kind
carries beyond the verdict -- a bench row's backend, variant, baseline flag, case JSON, cost
model and footprint (harness/bench.py; report figures are added to the JSON later), a merged
row's gpu and worker (harness/multi_gpu/), a crash's details (harness/isolate.py).
`from_json` reads any of them back, so a row survives a worker pipe, a merge or `--resume`
with the same keys.
"""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from harness import status
from harness.compare import OutputReport

CHECKPOINT_S = 20  # a run's --json is rewritten this often while it runs (`run`, and the --gpus merge)


@dataclass
class CaseResult:
    op: str
    impl: str
    case: str
    dtype: str
    device: str
    status: str  # one of harness/status.py
    outputs: list[OutputReport] = field(default_factory=list)
    reason: str = ""
    time_ms: float | None = None
    oracle: str = ""
    seed: int = 0
    repro: str = ""
    timing: dict | None = None  # the sample set of a timed run (timing.Samples.to_json())
    calls: int = 0  # implementation calls behind the verdict (repeats, then the stale check)
    spread: float | None = None  # run-to-run max |call i - call 1| / tolerance over the repeats; None: one call
    recheck: str = ""  # the stale-output check that ran: "oracle", "changed", or "" (none)
    extra: dict = field(default_factory=dict)  # JSON keys beyond these (module docstring)

    @property
    def passed(self) -> bool:
        return self.status in status.OK

    def report(self) -> str:
        head = f"{self.op} {self.impl} {self.case} [{self.device}, oracle={self.oracle}, seed={self.seed}]: {self.status}"
        lines = [head] + [f"  {o.line()}" for o in self.outputs]
        if self.spread:
            lines.append(f"  run-to-run spread over {self.calls if self.recheck == '' else self.calls - 1} calls "
                         f"on the same inputs: {self.spread:.3g} x tolerance")
        if self.reason:
            lines.append(f"  {self.reason}")
        if self.status in status.REPRO and self.repro:
            lines.append(f"  reproduce: {self.repro}")
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"op": self.op, "impl": self.impl, "case": self.case, "dtype": self.dtype, "device": self.device,
                "status": self.status, "reason": self.reason, "time_ms": self.time_ms, "oracle": self.oracle,
                "seed": self.seed, "outputs": [o.to_json() for o in self.outputs], "repro": self.repro,
                "timing": self.timing, "calls": self.calls, "spread": self.spread, "recheck": self.recheck,
                **self.extra}

    @classmethod
    def from_json(cls, row: dict) -> "CaseResult":
        """A row's JSON back as a CaseResult: its fields, its outputs as OutputReports, the rest in `extra`."""
        names = {f.name for f in fields(cls)} - {"extra", "outputs"}
        known = {k: v for k, v in row.items() if k in names}
        for key in ("dtype", "device"):
            known.setdefault(key, "")
        extra = {k: v for k, v in row.items() if k not in names and k != "outputs"}
        return cls(**known, outputs=[OutputReport.from_json(o) for o in row.get("outputs") or []], extra=extra)


# ----------------------------------------------------------------------------- results files of `run`


def write_run(path, head: dict, rows: list[dict], interrupted: str | None, **more) -> None:
    """The results JSON of a run, replaced atomically: `head` (device, device_name, cases, seed, oracle,
    versions), the status counts, `interrupted` (why it stopped early, or None), `more` (a merged run's
    gpus and workers), then the rows."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps({**head, "counts": status.counts(r.get("status") for r in rows),
                               "interrupted": interrupted, **more, "results": rows}, indent=1))
    tmp.replace(path)


def load_run(path) -> dict:
    """A results JSON of `harness run` (plain or .gz)."""
    raw = Path(path).read_bytes()
    return json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)


def resumed(path: str | None) -> tuple[list[CaseResult], set]:
    """(results of an earlier run, the (impl, case) pairs they cover); empty without --resume."""
    if not path:
        return [], set()
    rows = load_run(path)["results"]
    return [CaseResult.from_json(r) for r in rows], {(r["impl"], r["case"]) for r in rows}
