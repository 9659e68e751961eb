"""The figures bench reports beside the device time (issue 11, items 11-14): the loop figure and its
host-bound mark, the binding ceiling, impossible figures flagged rather than reported, and the peak
extra device memory of a call -- in the timing engine, the results JSON, report.md and BENCHMARKS.md."""
import copy
import json

import pytest

from harness import ceilings, timing
from harness.report import benchmarks_md, cells, figures, markdown
from harness.timing import TimingConfig
from test_report import synthetic, timing as samples_json

# ----------------------------------------------------------------------------- a fake GPU with a host


class HostGPU:
    """A host clock and an in-order GPU stream (seconds): a call costs `host` s of the host's time to
    queue, then `device` s on the GPU, which cannot start it before it is queued; `b2b_extra` s more
    when it starts the moment the previous call ends (the dirty-L2 write-back of a real GPU)."""

    def __init__(self, host_ms, device_ms, b2b_extra_ms=0.0):
        self.hc, self.dc, self.ec = host_ms * 1e-3, device_ms * 1e-3, b2b_extra_ms * 1e-3
        self.h = self.g = 0.0
        self.calls = []
        self.after_call = False  # the GPU's last work was a call

    def now(self):
        return self.h

    def call(self, i):
        self.calls.append(i)
        self.h += self.hc
        start = max(self.g, self.h)
        self.g = start + self.dc + (self.ec if self.after_call and start == self.g else 0.0)
        self.after_call = True

    def sync(self):
        self.h = max(self.h, self.g)

    def event(self):
        gpu = self

        class Event:
            def record(self):
                self.t = max(gpu.g, gpu.h)

            def synchronize(self):
                gpu.sync()

            def elapsed_time(self, other):
                return (other.t - self.t) * 1e3

        return Event()

    def hold(self):
        gpu = self

        class Hold:  # the spin: the GPU is busy while the host queues the call
            ms = 1.0

            def __call__(self):
                gpu.g = max(gpu.g, gpu.h) + 2 * gpu.hc + 1e-4
                gpu.after_call = False

            def spin_ms(self, ms):
                gpu.g = max(gpu.g, gpu.h) + ms * 1e-3
                gpu.after_call = False

            def adapt(self, host_ms):
                pass

        return Hold()


def cfg(**kw):
    base = dict(mode="hot", rel_ci=0.01, min_samples=5, max_samples=20, budget_s=0.05, warmup_min=2, warmup_max=5,
                warmup_budget_s=0.01)
    base.update(kw)
    return TimingConfig(**base)


def timed(gpu, **kw):
    return timing.time_fn(gpu.call, "cuda", cfg(**kw), framework="torch", sync=gpu.sync, now=gpu.now,
                          event=gpu.event, hold=gpu.hold())


def test_loop_figure_shows_the_host_time_of_a_host_bound_call():
    gpu = HostGPU(host_ms=0.3, device_ms=0.1)
    run = timed(gpu)
    s = run.samples
    assert s.median == pytest.approx(0.1)  # the hold hides the host: device time
    assert s.loop_ms == pytest.approx(0.3, rel=0.02) and s.loop_calls == 200  # 20 ms / 0.1 ms
    assert timing.host_bound(s.to_json())
    j = s.to_json()
    assert j["loop_ms"] == s.loop_ms and j["loop_calls"] == 200
    assert timing.Samples.from_json(j).loop_ms == s.loop_ms
    # the loop's calls come after the samples and before the final (re-validated) call
    assert max(gpu.calls) == run.last_index - 1 and len(gpu.calls) == run.last_index
    assert run.final_call() == pytest.approx(0.1) and gpu.calls[-1] == run.last_index


def test_loop_figure_equals_device_time_when_the_gpu_is_the_bottleneck():
    gpu = HostGPU(host_ms=0.01, device_ms=0.1)
    s = timed(gpu, loop_calls=50).samples
    assert s.loop_calls == 50 and s.loop_ms == pytest.approx(0.1, rel=0.05)
    assert s.b2b_ms == pytest.approx(0.1, rel=0.01)
    assert not timing.host_bound({**s.to_json(), "host_ms": 0.01})


def test_back_to_back_device_time_tells_a_slow_gpu_loop_from_a_host_bound_one():
    """A loop 20% over the cold device time, because back-to-back calls cost the GPU more (the host keeps
    ahead): b2b_ms shows it, and the row is not host-bound.  Without b2b_ms (older records) the loop rule
    alone marks it; a host-bound loop stays marked with it."""
    gpu = HostGPU(host_ms=0.01, device_ms=0.1, b2b_extra_ms=0.02)
    run = timed(gpu, loop_calls=50)
    s = run.samples
    assert s.median == pytest.approx(0.1)  # each sample follows the hold: no back-to-back cost
    assert s.loop_ms == pytest.approx(0.12, rel=0.02) and s.b2b_ms == pytest.approx(0.12, rel=0.02)
    j = s.to_json()
    assert j["b2b_ms"] == s.b2b_ms and timing.Samples.from_json(j).b2b_ms == s.b2b_ms
    assert not timing.host_bound(j)
    assert timing.host_bound({**j, "b2b_ms": None})
    # the b2b batches come after the loop and before the final call; each one's calls in order
    assert gpu.calls == list(range(run.last_index))
    host = HostGPU(host_ms=0.3, device_ms=0.1, b2b_extra_ms=0.02)
    hs = timed(host, loop_calls=50).samples
    assert hs.loop_ms == pytest.approx(0.3, rel=0.02) and hs.b2b_ms == pytest.approx(0.12, rel=0.02)
    assert timing.host_bound(hs.to_json())  # 0.3 > 1.1 x 0.12: the host


def test_time_b2b_spins_for_the_host_time_of_the_whole_batch():
    gpu = HostGPU(host_ms=0.05, device_ms=0.01)
    spins = []
    hold = gpu.hold()
    hold.spin_ms = lambda ms, spin=hold.spin_ms: (spins.append(ms), spin(ms))
    b2b, nxt = timing.time_b2b(gpu.call, 0, 40, hold, gpu.event, host_ms=0.05, now=gpu.now, repeats=3)
    assert spins == [pytest.approx(timing.B2B_SPIN_FACTOR * 40 * 0.05 + timing.B2B_SPIN_PAD_MS)] * 3
    assert b2b == pytest.approx(0.01) and gpu.calls == list(range(120)) and nxt == 120  # host time hidden behind the spin


def test_time_b2b_drops_a_batch_the_spin_did_not_cover_and_grows_the_spin():
    """host_ms from the sampling phase said 0.001 ms a call, the batch took 0.05: the first batch is
    dropped (the GPU waited for the host), the next spins 1.5 x its queueing time, and so on."""
    gpu = HostGPU(host_ms=0.05, device_ms=0.01)
    spins = []
    hold = gpu.hold()
    hold.spin_ms = lambda ms, spin=hold.spin_ms: (spins.append(ms), spin(ms))
    b2b, nxt = timing.time_b2b(gpu.call, 0, 40, hold, gpu.event, host_ms=0.001, now=gpu.now, repeats=3)
    grown = timing.B2B_SPIN_FACTOR * 40 * 0.05 + timing.B2B_SPIN_PAD_MS
    assert spins == [pytest.approx(timing.B2B_SPIN_FACTOR * 40 * 0.001 + timing.B2B_SPIN_PAD_MS)] + \
        [pytest.approx(grown)] * 3
    assert b2b == pytest.approx(0.01) and gpu.calls == list(range(160)) and nxt == 160
    capped = HostGPU(host_ms=10.0, device_ms=0.01)  # 400 ms to queue a batch: never covered
    assert timing.time_b2b(capped.call, 0, 40, capped.hold(), capped.event, host_ms=0.001, now=capped.now) == \
        (None, 200)


def test_loop_is_off_in_quick_configs_and_counts_calls_by_the_slower_side():
    assert not TimingConfig.quick().loop and not TimingConfig.quick().memory
    c = TimingConfig()
    assert timing.loop_calls(c, 0.001, None) == timing.LOOP_MAX_CALLS
    assert timing.loop_calls(c, 0.01, 1.0) == 20  # host-bound: 20 ms of host time
    assert timing.loop_calls(c, 50.0, 0.1) == timing.LOOP_MIN_CALLS
    gpu = HostGPU(host_ms=0.3, device_ms=0.1)
    assert timed(gpu, loop=False).samples.loop_ms is None


def test_peak_extra_memory_of_one_call_after_the_loop():
    gpu = HostGPU(host_ms=0.01, device_ms=0.1)
    seen = []

    def probe(run_one):
        before = len(gpu.calls)
        run_one()
        seen.append(gpu.calls[before:])
        return 3 << 20

    probe.note = "fake allocator"
    run = timing.time_fn(gpu.call, "cuda", cfg(loop_calls=10), framework="torch", sync=gpu.sync, now=gpu.now,
                         event=gpu.event, hold=gpu.hold(), memory=probe)
    s = run.samples
    assert s.peak_extra_bytes == 3 << 20 and s.peak_note == "fake allocator"
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0] == run.last_index - 1  # one call, before the final
    assert s.to_json()["peak_extra_bytes"] == 3 << 20


def test_memory_probes_per_framework_and_none_on_the_cpu():
    assert timing.memory_probe("torch", "cpu") == (None, "not measured on the CPU")
    probe, note = timing.memory_probe("jax", "cuda")
    assert probe is None and "jax" in note
    run = timing.time_fn(lambda i: None, "cpu", cfg(loop_calls=10))
    assert run.samples.peak_extra_bytes is None and run.samples.peak_note == "not measured on the CPU"
    assert run.samples.loop_ms is not None and run.samples.loop_calls == 10


# ----------------------------------------------------------------------------- binding ceiling


CEIL = {"device": {"kind": "cuda", "name": "NVIDIA H100 80GB HBM3"}, "copy": {"gbs": 3000.0},
        "matmul": {"bf16": {"tflops": 800.0, "name": "bf16"}, "fp32": {"tflops": 50.0, "name": "fp32 (TF32 off)"}}}


def test_binding_ceiling_is_chosen_by_arithmetic_intensity_against_the_ridge():
    # bf16 ridge: 800e12 / 3000e9 = 267 flop/byte
    attn = ceilings.figures(100 << 20, 400 * (100 << 20), 1.0, CEIL, "bf16")  # AI 400: compute-bound
    assert attn["binding"] == "matmul" and attn["pct_binding"] == pytest.approx(attn["pct_matmul"])
    norm = ceilings.figures(100 << 20, 5 * (100 << 20), 0.05, CEIL, "bf16")  # AI 5: memory-bound
    assert norm["binding"] == "copy" and norm["pct_binding"] == pytest.approx(norm["pct_copy"])
    # the same AI 100 is memory-bound in bf16 and compute-bound in f32 (ridge 50e12 / 3000e9 = 17)
    assert ceilings.figures(1 << 20, 100 << 20, 1.0, CEIL, "bf16")["binding"] == "copy"
    assert ceilings.figures(1 << 20, 100 << 20, 1.0, CEIL, "f32")["binding"] == "matmul"


# ----------------------------------------------------------------------------- impossible figures


def test_impossible_figures_against_the_datasheet():
    nbytes = 3 << 30
    ok = ceilings.figures(nbytes, 0, 1.0, CEIL, "bf16")  # 3.2 TB/s: under the H100 SXM's 3.35
    assert "impossible" not in ok and ok["gbs"] > 3000
    fast = ceilings.figures(nbytes, 0, 0.9, CEIL, "bf16")  # 3.6 TB/s
    assert fast["impossible"].startswith("IMPOSSIBLE: 0.9 ms is below the byte model's floor")
    assert "3350 GB/s" in fast["impossible"] and "gbs" not in fast and "pct_copy" not in fast
    assert "impossible" not in ceilings.figures(nbytes, 0, 0.9, CEIL, "bf16", dram=False)  # hot, L2-resident
    flops = ceilings.figures(1 << 20, int(2e12), 1.0, CEIL, "bf16")  # 2000 TFLOP/s
    assert "TFLOP/s is above the H100 SXM5 datasheet peak 989.4 TFLOP/s" in flops["impossible"]
    assert "impossible" not in ceilings.figures(1 << 20, int(2e12), 1.0, {**CEIL, "device": {"name": "Some GPU"}},
                                                "bf16")  # no datasheet: not judged
    assert ceilings.datasheet("NVIDIA H200")["gbs"] == 4800 and ceilings.datasheet("NVIDIA H100 PCIe")["gbs"] == 2000


def h100(results):
    results = copy.deepcopy(results)
    results["device"]["name"] = results["ceilings"]["device"]["name"] = "NVIDIA H100 80GB HBM3"
    return results


def test_an_impossible_row_is_flagged_and_not_reported_as_a_result(tmp_path):
    res = h100(synthetic())
    case = "mul[bf16,A=8x2048x4096,B=4096]"
    fast = next(r for r in res["rows"] if r["case"] == case and r["impl"] == "cupy@opt")
    fast["timing"] = samples_json(0.5)  # 3 GiB in 0.5 ms: 6.4 TB/s, cold
    figures.add_figures(res)
    assert fast["flag"].startswith("IMPOSSIBLE:") and figures.timed_ms(fast) is None
    assert "speedup_vs_baseline" not in fast["figures"] and "gbs" not in fast["figures"]
    assert fast["status"] == "PASS" and fast["timing"]["median"] == pytest.approx(0.5, rel=0.05)  # the raw time kept
    naive = next(r for r in res["rows"] if r["case"] == case and r["impl"] == "cupy@naive")
    assert "speedup_vs_ladder_ref" not in next(r for r in res["rows"] if r is fast)["figures"]
    assert naive.get("flag") is None and figures.timed_ms(naive)
    md = markdown.markdown(res)
    assert "| cupy@opt | PASS IMPOSSIBLE | – |" in md
    assert "### Impossible figures (not results)" in md and "below the byte model's floor" in md
    bm = benchmarks_md.benchmarks_md(res)
    assert "| cupy@opt | PASS IMPOSSIBLE |" in bm and "### Impossible figures (not results)" in bm
    fast["timing"] = samples_json(2.0)  # a rerun with a possible time clears the flag
    figures.add_figures(res)
    assert "flag" not in fast and figures.timed_ms(fast)


def test_bench_prints_impossible_rows(tmp_path, capsys):
    from harness.cli import main

    res = h100(synthetic())
    next(r for r in res["rows"] if r["impl"] == "cupy@opt")["timing"] = samples_json(0.5)
    src = tmp_path / "results.json"
    src.write_text(json.dumps(res))
    assert main(["bench", "--from", str(src), "--report", str(tmp_path / "rep"), "--no-plots"]) == 1  # triton FAILs
    out = capsys.readouterr().out
    assert "IMPOSSIBLE binary_backward cupy@opt mul[bf16,A=8x2048x4096,B=4096]: IMPOSSIBLE:" in out
    assert "1 impossible (not results)" in out
    table = out.splitlines()
    head = next(k for k, l in enumerate(table) if l.startswith("op ") and "loop ms" in l and "binding ceiling" in l)
    assert any("cupy@naive" in l and "% copy, " in l for l in table[head:])
    assert any("cupy@opt" in l and "IMPOSSIBLE" in l for l in table[head:])
    saved = json.loads((tmp_path / "rep" / "results.json").read_text())
    assert sum(1 for r in saved["rows"] if (r.get("flag") or "").startswith("IMPOSSIBLE")) == 1


# ----------------------------------------------------------------------------- the reports


def with_loop_and_memory(res):
    for r in res["rows"]:
        if r.get("timing"):
            med = r["timing"]["median"]
            r["timing"].update(loop_ms=med * (2.5 if r["impl"] == "cupy@opt" else 1.02), loop_calls=100,
                               peak_extra_bytes=(64 << 20) if r["impl"] == "torch" else 0)
    return figures.add_figures(res)


def test_report_md_shows_loop_host_bound_binding_ceiling_and_peak_memory():
    res = with_loop_and_memory(synthetic())
    opt = next(r for r in res["rows"] if r["impl"] == "cupy@opt")
    torch = next(r for r in res["rows"] if r["impl"] == "torch")
    assert opt["figures"]["host_bound"] and opt["figures"]["loop_ratio"] == pytest.approx(2.5)
    assert not torch["figures"]["host_bound"] and torch["figures"]["binding"] == "copy"
    md = markdown.markdown(res)
    opt_line = next(l for l in md.splitlines() if "| cupy@opt |" in l)
    assert "(host-bound) |" in opt_line and "% copy, " in opt_line and "GB/s |" in opt_line
    torch_line = next(l for l in md.splitlines() if "| torch (baseline) |" in l)
    assert "64.0 MiB" in torch_line and "host-bound" not in torch_line
    assert "host-bound: the host needs longer to queue a call than the GPU to run it" in md


def test_a_row_timed_throttled_throughout_is_marked_with_its_clock(tmp_path):
    res = with_loop_and_memory(synthetic())
    opt = next(r for r in res["rows"] if r["impl"] == "cupy@opt")
    opt["timing"].update(throttled_all=True, clocks={"median_mhz": 1635.0, "reference_mhz": 1980.0})
    md = markdown.markdown(res)
    assert "(throttled, 1635 MHz) |" in next(l for l in md.splitlines() if "| cupy@opt |" in l)
    assert "throttled" not in next(l for l in md.splitlines() if "| torch (baseline) |" in l)
    assert "throttled (beside a time): every sample ran below 95% of the run's top SM clock" in md
    path = tmp_path / "BENCHMARKS.md"
    benchmarks_md.update_benchmarks_md(res, path)
    text = path.read_text()
    assert "(throttled, 1635 MHz) |" in next(l for l in text.splitlines() if "| cupy@opt |" in l)
    assert sum("(throttled," in l for l in text.splitlines() if l.startswith("|")) == 1
    assert any("(throttled, 1635 MHz)" in l for l in cells.console(res["rows"]))


def test_benchmarks_md_from_several_runs_keeps_hand_written_text_and_other_ops(tmp_path):
    one = with_loop_and_memory(synthetic())
    other = copy.deepcopy(one)
    for r in other["rows"]:
        r["op"] = "layernorm_backward"
    other["command"] = "python -m harness bench --op layernorm_backward"
    other["ops"] = {"layernorm_backward": {"cost_model": "bytes: dy, x, dx."}}
    path = tmp_path / "BENCHMARKS.md"
    path.write_text("# Intro by hand\n\n" + benchmarks_md.BEGIN + "\nold\n" + benchmarks_md.END + "\n\n## Notes by hand\n")
    benchmarks_md.update_benchmarks_md([one, other], path)
    text = path.read_text()
    assert text.startswith("# Intro by hand") and text.rstrip().endswith("## Notes by hand") and "\nold\n" not in text
    assert "<!-- gradoracle:op binary_backward begin -->" in text and "<!-- gradoracle:op layernorm_backward end -->" in text
    assert "Command: `python -m harness bench --op layernorm_backward`" in text
    line = next(l for l in text.splitlines() if "| cupy@opt |" in l)
    assert "(host-bound)" in line and "% copy," in line and line.rstrip().endswith("x |")  # speedup vs torch
    # a later run of one op replaces that op's section only
    newer = copy.deepcopy(one)
    newer["command"] = "python -m harness bench --op binary_backward --rerun"
    benchmarks_md.update_benchmarks_md(newer, path)
    again = path.read_text()
    assert "--rerun" in again and "Command: `python -m harness bench --op layernorm_backward`" in again
    assert again.startswith("# Intro by hand") and again.count(benchmarks_md.BEGIN) == 1
    assert again.count("<!-- gradoracle:op binary_backward begin -->") == 1


def test_bench_from_several_jsons_writes_benchmarks_md(tmp_path, capsys):
    from harness.cli import main

    one = with_loop_and_memory(synthetic())
    other = copy.deepcopy(one)
    for r in other["rows"]:
        r["op"] = "layernorm_backward"
    paths = []
    for k, doc in enumerate((one, other)):
        paths.append(tmp_path / f"r{k}.json")
        paths[-1].write_text(json.dumps(doc))
    md = tmp_path / "BENCHMARKS.md"
    main(["bench", "--from", str(paths[0]), "--from", str(paths[1]), "--benchmarks-md", str(md)])
    text = md.read_text()
    assert "## binary_backward" in text and "## layernorm_backward" in text
