"""Registers, spills and occupancy of the `triton` backend's kernels on every perf case, for
sm_90 (H100), with no GPU: each launch is planned as the backend plans it on an H100 (132
SMs; a split loop sized from the occupancy of its own compiled kernel), compiled by triton
for target cuda:90, and its PTX assembled by triton's ptxas -v with the flags triton uses.

    python scripts/triton_regs.py [--op binary_backward] [--op reduce_sum] [--configs default|candidates|presets]
                                  [--fns] [--json OUT.json]

One row per launch: case, sizing, kernel, block shape, warps, grid, registers, spill bytes
(stores/loads), programs per SM, waves.  --fns adds pow, sub and minimum (bf16) on the
no-broadcast and bias-gradient shapes to binary_backward's perf cases.  Run it without
TRITON_INTERPRET.  (The registers can differ by a few from a GPU's: another triton or ptxas.)
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from math import prod
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SMS = 132
TY = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "f64": "fp64"}
ITEM = {"f32": 4, "f16": 2, "bf16": 2, "f64": 8}
_CACHE: dict = {}


def compile_sm90(kernel, ptrs: dict, ints: dict, constexprs: dict, num_warps: int) -> dict:
    """Compile `kernel` for sm_90 as a launch with these arguments would (pointers 16-byte
    aligned, ints specialised as triton's launcher does); {"regs", "spills", "ptx", "ttgir", ...}."""
    import triton
    from triton.backends.compiler import GPUTarget

    dont = set(kernel.do_not_specialize) | {kernel.arg_names[i] for i in kernel.do_not_specialize
                                           if isinstance(i, int)}
    signature, attrs, consts = {}, {}, dict(constexprs)
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in ptrs:
            signature[name] = "*" + ptrs[name]
            attrs[(i,)] = [["tt.divisibility", 16]]  # torch allocations are 16-byte aligned
        elif name not in dont and ints[name] == 1:
            signature[name] = "constexpr"  # the launcher specialises an int of 1
            consts[name] = 1
        else:
            signature[name] = "i32"
            if name not in dont and ints[name] % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    key = (kernel.__name__, tuple(sorted(signature.items())), tuple(sorted((k, str(v)) for k, v in consts.items())),
           tuple(sorted(attrs)), num_warps)
    if key in _CACHE:
        return _CACHE[key]
    src = triton.compiler.ASTSource(fn=kernel, signature=signature, constexprs=consts, attrs=attrs)
    compiled = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as d:
        Path(d, "k.ptx").write_text(ptx)
        log = subprocess.run([triton.knobs.nvidia.ptxas.path, "-lineinfo", "-v", "--regAllocOptLevel=2",
                              "--gpu-name=sm_90a", str(Path(d, "k.ptx")), "-o", str(Path(d, "k.o"))],
                             capture_output=True, text=True).stderr
    regs = re.findall(r"Used (\d+) registers", log)
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    out = {"regs": int(regs[0]) if regs else None,
           "spill_st": int(spills[0][0]) if spills else 0, "spill_ld": int(spills[0][1]) if spills else 0,
           "shared": int(compiled.metadata.shared), "ptx": ptx, "ttgir": compiled.asm["ttgir"],
           "ttir": compiled.asm["ttir"], "cubin": compiled.asm.get("cubin", b"")}
    _CACHE[key] = out
    return out


def occupancy(res: dict, num_warps: int) -> int:
    from backends.triton._steps import programs_per_sm

    return programs_per_sm(res["regs"] or 255, res["shared"], num_warps)


# ----------------------------------------------------------------------------- binary_backward

LLAMA = (8, 2048, 4096)


def binary_requests(extra_fns: bool) -> list[tuple]:
    """(fn, dtype, A, B) of every perf case (+ pow, sub, minimum in bf16 on two shapes)."""
    from cases import select

    out = [(c.params["fn"], c.dtype, tuple(c.params["a"]), tuple(c.params["b"]))
           for c in select("perf", op="binary_backward")]
    if extra_fns:
        out += [(fn, "bf16", LLAMA, b) for fn in ("pow", "sub", "minimum") for b in (LLAMA, (4096,))]
    return out


def binary_launches(fn: str, dt: str, a_shape, b_shape, cfg) -> list[dict]:
    """The launches of one call as the backend plans them on an H100, each compiled for sm_90."""
    from backends._plans import binary_backward as _bcast_plan
    from backends.triton import binary_backward as tk

    o = _bcast_plan.broadcast_shape(a_shape, b_shape)
    cs = _bcast_plan.contiguous_strides
    bplan = _bcast_plan.make_plan(a_shape, b_shape, cs(a_shape), cs(b_shape), cs(o))
    item, ty = ITEM[dt], TY[dt]
    acc = "fp64" if dt == "f64" else "fp32"
    io = dict.fromkeys(("a_ptr", "b_ptr", "g_ptr", "ga_ptr", "gb_ptr"), ty)
    rows = []
    if bplan.contiguous_fast_path():
        block, warps = tk.flat_block(bplan.numel, item, cfg)
        res = compile_sm90(tk._flat_kernel, io, {"n": bplan.numel}, {"FN": fn, "IS_F64": dt == "f64", "BLOCK": block},
                           warps)
        rows.append(dict(kernel="flat", shape=f"BLOCK {block}", warps=warps, grid=-(-bplan.numel // block), res=res))
        return rows

    def ptrs(L):
        return dict(io, wsa_ptr=acc if L.parts_a > 1 or L.scratch_a else ty,
                    wsb_ptr=acc if L.parts_b > 1 or L.scratch_b else ty, desc_ptr="i64")

    def ask(L):
        return occupancy(compile_sm90(tk._tile_kernel, ptrs(L), L.ints, L.constexprs, L.num_warps), L.num_warps)

    L = tk.plan_tile(bplan, item, fn, replace(cfg, sms=0), SMS, ask)
    c = L.constexprs
    if L.kernel == "batch":  # both operands broadcast: batch tiles x row chunks
        res = compile_sm90(tk._batch_kernel, ptrs(L), L.ints, L.constexprs, L.num_warps)
        shape = f"T{c['BT']} N{c['BN']}{' swap' if c['SWAP'] else ''}"
    else:
        res = compile_sm90(tk._tile_kernel, ptrs(L), L.ints, L.constexprs, L.num_warps)
        shape = f"K{c['BK']} A{c['BA']} B{c['BB']} {'loopB' if c['LOOP_B'] else 'loopA'}"
    rows.append(dict(kernel=L.kernel, shape=f"{shape}{' pf' if c['PREFETCH'] else ''} parts {L.parts_a}/{L.parts_b} "
                     f"iters {L.ints['iters']}", warps=L.num_warps, grid=L.grid, res=res))
    for parts, n in zip((L.parts_a, L.parts_b), L.grad_numels):
        if parts > 1:
            bp, bn = tk.stage2_blocks(parts, n, ITEM["f64" if dt == "f64" else "f32"], cfg)
            warps = tk.stage2_warps(bp, bn, 4, cfg)
            res = compile_sm90(tk._sum_partials_kernel, {"ws_ptr": acc, "out_ptr": ty}, {"n": n, "parts": parts},
                               {"BP": bp, "BN": bn}, warps)
            rows.append(dict(kernel="stage2", shape=f"BP {bp} BN {bn}", warps=warps, grid=-(-n // bn), res=res))
    return rows


def binary_configs(which: str, fn: str, dt: str, a_shape, b_shape) -> list[tuple[str, object]]:
    from backends._plans import binary_backward as _bcast_plan
    from backends.triton import binary_backward as tk

    if which == "presets":
        return list(tk.PRESETS.items())
    o = _bcast_plan.broadcast_shape(a_shape, b_shape)
    cs = _bcast_plan.contiguous_strides
    bplan = _bcast_plan.make_plan(a_shape, b_shape, cs(a_shape), cs(b_shape), cs(o))
    cands = tk.candidates(tk.tune_class(bplan, ITEM[dt], fn))
    return [(f"c{i}", c) for i, c in enumerate(cands if which == "candidates" else cands[:1])]


# ----------------------------------------------------------------------------- reduce_sum


def reduce_requests() -> list[tuple]:
    from cases import select

    out = []
    for case in select("perf", op="reduce_sum"):
        shape = case.params["shape"]
        strides = [prod(shape[i + 1:]) for i in range(len(shape))]
        if case.params.get("x_layout") == "transposed":
            strides[-1], strides[-2] = shape[-2], 1
        params = {k: v for k, v in case.params.items() if k in ("axes", "keepdim", "target")}
        out.append((case.id, case.dtype, shape, strides, params))
    return out


def reduce_launches(dt: str, shape, strides, params, cfg) -> list[dict]:
    from backends.triton import reduce_sum as rs

    ty, acc = TY[dt], "fp64" if dt == "f64" else "fp32"

    def ptrs(L):
        finish = L.constexprs["FINISH"]
        return {"x_ptr": ty, "y_ptr": ty, "ws_ptr": acc if finish else ty,
                "cnt_ptr": "i32" if finish == 2 else (acc if finish else ty), "desc_ptr": "i64"}

    def ask(L):
        ints = dict(L.ints, chunks=2)
        return occupancy(compile_sm90(rs._KERNELS[L.kernel], ptrs(L), ints, L.constexprs, L.num_warps), L.num_warps)

    L = rs.plan_request(shape, strides, ITEM[dt], params, cfg, SMS, ask)
    if not L.kernel:
        return []
    res = compile_sm90(rs._KERNELS[L.kernel], ptrs(L), L.ints, L.constexprs, L.num_warps)
    c = L.constexprs
    blk = f"BM {c['BM']} BC {c['BC']}" if L.kernel == "row" else f"BR {c['BR']} BN {c['BN']}"
    rows = [dict(kernel=L.kernel, shape=f"{blk} chunks {L.chunks} finish {c['FINISH']}"
                 + (f" U{c['UNROLL']}" if "UNROLL" in c else ""), warps=L.num_warps, grid=L.grid, res=res)]
    if L.stage2 is not None:
        grid, bp, bn, warps = L.stage2
        res = compile_sm90(rs._stage2_kernel, {"ws_ptr": acc, "y_ptr": ty}, {"n_y": L.n_y, "parts": L.chunks},
                           {"BP": bp, "BN": bn}, warps)
        rows.append(dict(kernel="stage2", shape=f"BP {bp} BN {bn}", warps=warps, grid=grid, res=res))
    return rows


def reduce_configs(which: str) -> list[tuple[str, object]]:
    from backends.triton import reduce_sum as rs

    if which == "presets" and hasattr(rs, "PRESETS"):
        return list(rs.PRESETS.items())
    return [("default", rs.GPU_CONFIG)]


# ----------------------------------------------------------------------------- table


def _row(case: str, cfg_name: str, r: dict) -> dict:
    res = r["res"]
    occ = occupancy(res, r["warps"])
    return {"case": case, "config": cfg_name, "kernel": r["kernel"], "shape": r["shape"], "warps": r["warps"],
            "grid": r["grid"], "regs": res["regs"], "spill_st": res["spill_st"], "spill_ld": res["spill_ld"],
            "occupancy": occ, "waves": round(r["grid"] / (SMS * occ), 2)}


def _print(row: dict) -> None:
    print(f"{row['case']:52s} {row['config']:16s} {row['kernel']:6s} {row['shape']:46s} w{row['warps']:<2d} "
          f"grid {row['grid']:6d} regs {row['regs']:4d} spill {row['spill_st']:4d}/{row['spill_ld']:<4d} "
          f"occ {row['occupancy']:2d} waves {row['waves']:6.2f}", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--op", action="append", choices=("binary_backward", "reduce_sum"))
    ap.add_argument("--configs", choices=("default", "candidates", "presets"), default="default")
    ap.add_argument("--fns", action="store_true", help="binary_backward: add pow, sub, minimum (bf16)")
    ap.add_argument("--match", default="", help="only cases whose id contains this")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        ap.error("run without TRITON_INTERPRET=1: the kernels are compiled, not interpreted")
    rows = []
    ops = args.op or ["binary_backward", "reduce_sum"]
    if "binary_backward" in ops:
        for fn, dt, a, b in binary_requests(args.fns):
            case = f"{fn}[{dt},A={'x'.join(map(str, a))},B={'x'.join(map(str, b))}]"
            if args.match not in case:
                continue
            for name, cfg in binary_configs(args.configs, fn, dt, a, b):
                for r in binary_launches(fn, dt, a, b, cfg):
                    rows.append(_row(case, name, r))
                    _print(rows[-1])
    if "reduce_sum" in ops:
        for cid, dt, shape, strides, params in reduce_requests():
            if args.match not in cid:
                continue
            for name, cfg in reduce_configs(args.configs):
                for r in reduce_launches(dt, shape, strides, params, cfg):
                    rows.append(_row(cid, name, r))
                    _print(rows[-1])
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
