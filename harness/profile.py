"""`python -m harness profile`: one implementation on one case under Nsight Compute (ncu), and the
readings kernel authors use to find their next rung.

The case runs in a child process (`python -m harness.profile --child ...`) under
`ncu --profile-from-start off --clock-control none`: the child builds the case's inputs, calls
the implementation once outside the profiled range (compiles, plan caches), then once between
cudaProfilerStart and cudaProfilerStop, so only that call's kernels are measured.  The clocks are
left alone (the device README forbids changing them).

Autotuning happens before, in the same child run without ncu.  Under ncu one of triton's tuners
on the H100 kept a one-launch plan where a plain run keeps a three-launch one: ncu intercepts
every launch, even outside the profiled range, the likely cause.  So the first child
records each tuner's choice in the file named by $GRADORACLE_TUNE_FILE
(harness.timing.TUNE_FILE_ENV; a backend's tuner reads and writes it), and the profiled child
takes those choices without timing.

Per kernel it prints: duration; DRAM bytes, GB/s and % of peak; achieved and theoretical
occupancy; global-load and global-store sectors per request; grid, block, waves per SM and the
tail (fraction of the last wave that is full); registers per thread; shared-memory bank
conflicts; tensor-pipe utilisation; and the top stall reasons (% of active warps' cycles).
`--json` keeps them.  Where ncu is missing, or the GPU's counters cannot be read (gVisor,
permissions), it says so and exits 2.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.timing import TUNE_FILE_ENV

# name in the report -> ncu metric
METRICS = {
    "duration_ns": "gpu__time_duration.sum",
    "dram_read_bytes": "dram__bytes_read.sum",
    "dram_write_bytes": "dram__bytes_write.sum",
    "dram_pct_peak": "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed",
    "occupancy_achieved_pct": "sm__warps_active.avg.pct_of_peak_sustained_active",
    "occupancy_theoretical_pct": "sm__maximum_warps_per_active_cycle_pct",
    "ld_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    "ld_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    "st_sectors": "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    "st_requests": "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    "grid_size": "launch__grid_size",
    "block_size": "launch__block_size",
    "waves_per_sm": "launch__waves_per_multiprocessor",
    "registers_per_thread": "launch__registers_per_thread",
    "smem_bank_conflicts_ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "smem_bank_conflicts_st": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "tensor_pipe_pct": "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
}
STALLS = ("long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
          "math_pipe_throttle", "tex_throttle", "wait", "not_selected", "selected", "no_instruction",
          "branch_resolving", "dispatch_stall", "drain", "imc_miss", "sleeping")
for _s in STALLS:
    METRICS[f"stall_{_s}_pct"] = f"smsp__warp_issue_stalled_{_s}_per_warp_active.pct"

NO_NCU = ("harness profile: ncu (Nsight Compute) was not found on PATH or in /usr/local/cuda/bin; "
          "install Nsight Compute or run on a machine that has it")


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for candidate in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/ncu"):
        if os.access(candidate, os.X_OK):
            return candidate
    return None


# ----------------------------------------------------------------------------- reading ncu's CSV

def _number(text: str) -> float | None:
    text = text.strip().replace(",", "")
    if not text or text in ("n/a", "N/A"):
        return None
    try:
        return float(text)
    except ValueError:
        return None


def parse_csv(text: str) -> list[dict]:
    """ncu `--csv --page raw` output -> one dict per kernel launch: name, id, metric values
    (by our names), in launch order.  Lines ncu prints before the table (==PROF==, the
    program's own output) are skipped; the units row under the header is skipped."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    if not lines:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    header, body = rows[0], rows[1:]
    if body and body[0] and body[0][0] == "":  # the units row
        body = body[1:]
    col = {name: i for i, name in enumerate(header)}
    by_metric = {ncu: ours for ours, ncu in METRICS.items()}
    kernels = []
    for row in body:
        if len(row) != len(header):
            continue
        k = {"id": row[col["ID"]] if "ID" in col else str(len(kernels)),
             "name": row[col["Kernel Name"]] if "Kernel Name" in col else "?"}
        for ncu_name, i in col.items():
            if ncu_name in by_metric:
                k[by_metric[ncu_name]] = _number(row[i])
        kernels.append(derive(k))
    return kernels


def derive(k: dict) -> dict:
    """Add the figures computed from the raw metrics: GB/s, sectors per request, tail, top stalls."""
    def get(name):
        v = k.get(name)
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else v

    ns = get("duration_ns")
    moved = (get("dram_read_bytes") or 0) + (get("dram_write_bytes") or 0)
    k["dram_gbps"] = moved / ns if ns else None  # bytes per ns = GB/s
    for kind in ("ld", "st"):
        req = get(f"{kind}_requests")
        k[f"{kind}_sectors_per_request"] = get(f"{kind}_sectors") / req if req else None
    waves = get("waves_per_sm")
    if waves:
        frac = waves - math.floor(waves)
        k["tail_wave_fill"] = frac if frac else 1.0  # 1.0: the last wave is full
    stalls = sorted(((s, get(f"stall_{s}_pct")) for s in STALLS if get(f"stall_{s}_pct")),
                    key=lambda sv: -sv[1])
    k["top_stalls"] = [{"reason": s, "pct": v} for s, v in stalls[:4]]
    return k


def figure(v, fmt: str, unit: str = "", missing: str = "n/a") -> str:
    """One reading formatted (`missing` where ncu gave none): the text report's and scripts/gpu/profile_table.py's."""
    return missing if v is None else format(v, fmt) + unit


def format_kernel(k: dict) -> str:
    lines = [f"kernel {k['id']}: {k['name'][:110]}",
             f"  time {figure(k.get('duration_ns') and k['duration_ns'] / 1e3, '.2f', ' us')}; "
             f"DRAM {figure(k.get('dram_gbps'), '.0f', ' GB/s')} = "
             f"{figure(k.get('dram_pct_peak'), '.1f', '% of peak')} "
             f"(read {figure(k.get('dram_read_bytes') and k['dram_read_bytes'] / 1e6, '.1f', ' MB')}, "
             f"write {figure(k.get('dram_write_bytes') and k['dram_write_bytes'] / 1e6, '.1f', ' MB')})",
             f"  occupancy achieved {figure(k.get('occupancy_achieved_pct'), '.1f', '%')} of theoretical "
             f"{figure(k.get('occupancy_theoretical_pct'), '.1f', '%')}; registers/thread "
             f"{figure(k.get('registers_per_thread'), '.0f')}",
             f"  sectors/request: global load {figure(k.get('ld_sectors_per_request'), '.2f')}, "
             f"global store {figure(k.get('st_sectors_per_request'), '.2f')}; shared bank conflicts ld "
             f"{figure(k.get('smem_bank_conflicts_ld'), '.0f')} st {figure(k.get('smem_bank_conflicts_st'), '.0f')}",
             f"  grid {figure(k.get('grid_size'), '.0f')} x block {figure(k.get('block_size'), '.0f')}: "
             f"{figure(k.get('waves_per_sm'), '.2f')} waves per SM, "
             f"last wave {figure(k.get('tail_wave_fill'), '.0%')} full; "
             f"tensor pipe {figure(k.get('tensor_pipe_pct'), '.1f', '%')}",
             "  top stalls: " + (", ".join(f"{s['reason']} {s['pct']:.1f}%" for s in k.get("top_stalls", []))
                                 or "n/a")]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- the child

def child(op: str, impl_id: str, case_spec: str, seed: int) -> int:
    """Run the case: one warm call, then one call inside cudaProfilerStart/Stop."""
    from cases import select
    from harness import frameworks
    from harness.registry import find_impl, get_op
    from harness.prepare import generate

    (case,) = [c for c in select(case_spec) if c.op == op] or [None]
    if case is None:
        print(f"harness profile: the case is not a {op} case: {case_spec}", file=sys.stderr)
        return 2
    impl = find_impl(op, impl_id)
    reason = impl.skip_reason(case, "cuda")
    if reason:
        print(f"harness profile: {impl.id} cannot run this case on cuda: {reason}", file=sys.stderr)
        return 2
    spec = get_op(op)
    fw = frameworks.adapter(impl.backend.framework)
    host = generate(case, seed)
    shapes = spec.shapes(case)
    inputs = {k: fw.view(fw.upload(t, "cuda"), t) for k, t in host.items()}
    outs = {o: fw.poisoned(shapes[o], case.dtype, "cuda") for o in spec.outputs_of(case)}
    impl.fn(inputs, outs, case.params)  # warm: compiles, autotuning, plan caches
    fw.sync("cuda")
    import torch

    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    impl.fn(inputs, outs, case.params)
    fw.sync("cuda")
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    return 0


# ----------------------------------------------------------------------------- the command

def add_parser(sub) -> None:
    p = sub.add_parser("profile", help="run one implementation on one case under Nsight Compute (ncu) and print "
                                       "bandwidth, occupancy, sectors/request, waves, registers, bank conflicts, "
                                       "stalls")
    p.add_argument("--op", required=True)
    p.add_argument("--backend", required=True, help="backend or backend@variant")
    p.add_argument("--case", required=True, help="one JSON case (or a tag/file selecting exactly one case of --op)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the per-kernel readings to this file")
    p.add_argument("--ncu", help="path of ncu (default: PATH, then /usr/local/cuda/bin)")


def cmd_profile(args) -> int:
    ncu = args.ncu or find_ncu()
    if not ncu or not os.access(ncu, os.X_OK):
        print(NO_NCU if not ncu else f"harness profile: --ncu {ncu} is not an executable file", file=sys.stderr)
        return 2
    metrics = ",".join(METRICS.values())
    child_cmd = [sys.executable, "-m", "harness.profile", "--child", "--op", args.op, "--backend", args.backend,
                 "--case", args.case, "--seed", str(args.seed)]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, **{TUNE_FILE_ENV: str(Path(tmp) / "tuned.json")})
        warm = subprocess.run(child_cmd, capture_output=True, text=True, env=env)  # tuning, no ncu
        if warm.returncode != 0:
            print(f"harness profile: the case failed before profiling (exit {warm.returncode})", file=sys.stderr)
            print("\n".join((warm.stdout + "\n" + warm.stderr).strip().splitlines()[-25:]), file=sys.stderr)
            return 2
        cmd = [ncu, "--profile-from-start", "off", "--clock-control", "none", "--target-processes", "all",
               "--csv", "--page", "raw", "--metrics", metrics, *child_cmd]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    text = proc.stdout + "\n" + proc.stderr
    kernels = parse_csv(proc.stdout)
    if proc.returncode != 0 or not kernels:
        why = _diagnose(text)
        print(f"harness profile: ncu gave no readings (exit {proc.returncode}){': ' + why if why else ''}",
              file=sys.stderr)
        print("\n".join(text.strip().splitlines()[-25:]), file=sys.stderr)
        return 2
    print(f"{args.op} {args.backend} {args.case}: {len(kernels)} kernel launch(es) in one call")
    for k in kernels:
        print(format_kernel(k))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps({"op": args.op, "impl": args.backend, "case": args.case,
                                               "seed": args.seed, "ncu": ncu, "kernels": kernels}, indent=1))
    return 0


def _diagnose(text: str) -> str:
    if "ERR_NVGPUCTRPERM" in text or "permission" in text.lower():
        return "this user may not read the GPU's performance counters (ERR_NVGPUCTRPERM)"
    if "LibraryNotLoaded" in text or "Failed to initialize the profiler" in text:
        return "the profiler cannot initialise here (e.g. a gVisor sandbox has no counter access)"
    if "No kernels were profiled" in text:
        return "no kernel ran between cudaProfilerStart and cudaProfilerStop"
    return ""


def _main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m harness.profile")
    p.add_argument("--child", action="store_true")
    p.add_argument("--op", required=True)
    p.add_argument("--backend", required=True)
    p.add_argument("--case", required=True)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    return child(a.op, a.backend, a.case, a.seed)


if __name__ == "__main__":
    sys.exit(_main())
