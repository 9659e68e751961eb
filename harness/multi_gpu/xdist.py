"""`pytest -n N` (pytest-xdist) on a GPU host: worker gwK pinned to GPU K mod #GPUs before anything
in it initialises CUDA (conftest.py calls `pin_xdist_worker` at import), and the controller's
"GPU per worker" summary at the end of the session (`xdist_pin_report`, registered by conftest.py)."""
from __future__ import annotations

import os
import sys

from harness.multi_gpu.gpus import nvml_gpu_count, visible_gpus


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
