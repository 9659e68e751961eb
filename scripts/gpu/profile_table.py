"""A BENCHMARKS.md table of `harness profile --json` files: one row per kernel launch of each profiled call.

    python scripts/gpu/profile_table.py PROFILE.json [PROFILE.json ...] [--label]

Columns: the case id (the registry's, once per call) and implementation, the kernel, its time under ncu,
tensor-pipe use, achieved / theoretical occupancy, registers per thread, grid and waves (with how full
the last wave is), shared-memory bank conflicts (load / store), global sectors per request (load / store),
DRAM GB/s and the two largest stall reasons.  --label puts the file name in the first column, for finding
the profile's text beside it.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cases.registry import from_json  # noqa: E402
from harness.profile import figure  # noqa: E402


def _num(v, fmt: str) -> str:
    return figure(v, fmt, missing="-")

HEAD = ["case", "impl", "kernel", "us", "tensor pipe", "occupancy", "regs", "grid x block (waves, last)",
        "bank conflicts ld / st", "sectors/req ld / st", "DRAM GB/s", "top stalls"]


def _short(name: str) -> str:
    """A kernel's name without its return type and argument list: `void f<T, 2>(A, B)` -> `f<T, 2>`."""
    name = re.sub(r"^void\s+", "", name)
    depth, out = 0, []
    for ch in name:  # cut at the first '(' outside the template brackets
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            break
        out.append(ch)
    return "".join(out).replace("__nv_bfloat16", "bf16").replace("__half", "f16")


def rows(doc: dict, label: str | None = None) -> list[list[str]]:
    case = doc["case"]
    case = from_json(json.loads(case) if isinstance(case, str) else case, "profile").id
    out = []
    for i, k in enumerate(doc["kernels"]):
        waves = f"{_num(k.get('waves_per_sm'), '.2f')}, {_num(k.get('tail_wave_fill'), '.0%')}"
        stalls = ", ".join(f"{s['reason']} {s['pct']:.0f}%" for s in (k.get("top_stalls") or [])[:2])
        out.append([
            (label or case) if i == 0 else "", doc["impl"] if i == 0 else "", f"`{_short(k['name'])}`",
            _num(k.get("duration_ns") and k["duration_ns"] / 1e3, ".1f"),
            _num(k.get("tensor_pipe_pct"), ".1f") + "%",
            f"{_num(k.get('occupancy_achieved_pct'), '.1f')} / {_num(k.get('occupancy_theoretical_pct'), '.1f')}%",
            _num(k.get("registers_per_thread"), ".0f"),
            f"{_num(k.get('grid_size'), '.0f')} x {_num(k.get('block_size'), '.0f')} ({waves})",
            f"{_num(k.get('smem_bank_conflicts_ld'), '.0f')} / {_num(k.get('smem_bank_conflicts_st'), '.0f')}",
            f"{_num(k.get('ld_sectors_per_request'), '.2f')} / {_num(k.get('st_sectors_per_request'), '.2f')}",
            _num(k.get("dram_gbps"), ".0f"), stalls])
    return out


def table(paths: list[str], label: bool = False) -> list[str]:
    lines = ["| " + " | ".join(HEAD) + " |", "|---|---|---|" + "---:|" * 4 + "---|---:|---:|---:|---|"]
    for p in paths:
        with open(p) as f:
            doc = json.load(f)
        for r in rows(doc, Path(p).name if label else None):
            lines.append("| " + " | ".join(r) + " |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+")
    ap.add_argument("--label", action="store_true", help="the file name instead of the case id")
    a = ap.parse_args(argv)
    print("\n".join(table(a.profiles, a.label)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
