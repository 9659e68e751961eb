"""Many GPUs: `harness run --gpus N`, pinning pytest-xdist workers (`pytest -n N`), and checking a
split run against a single one.  One module per job:

    gpus      which GPUs this host has, counted without initialising CUDA (NVML, CUDA_VISIBLE_DEVICES)
    xdist     pinning `pytest -n N` worker gwK to GPU K mod #GPUs, and the "GPU per worker" summary
    workers   the `run --gpus N` driver: N `harness run --shard k/N` workers, one per GPU, their output
    merge     their rows into one report and one JSON, in single-run order
    check     a `--gpus` run against a single run (rows, verdicts, spread), two pytest sessions by junit
    cli       `python -m harness.multi_gpu compare | compare-junit` (scripts/gpu_multi.sh)

`harness run --gpus N [selection ...]` starts N workers, each an ordinary `harness run` of the
same selection with `--shard k/N --seed S --device D --json <worker-k.json>` (all other
options passed through, --isolate included) and with CUDA_VISIBLE_DEVICES set to the k-th
visible GPU in its environment, so the pin is in place before anything in it touches CUDA.
Their rows are relayed as they come, then merged into one report and one JSON in the
order a single run would give (resumed rows first, then by op and case), each row with
"gpu" (the CUDA_VISIBLE_DEVICES entry its worker had; null on the CPU) and "worker" (k).
The merged JSON has a single run's keys plus "workers" (per worker: gpu, shard, exit
status, counts).  The exit status is 0 only if every case passed and every worker
finished; 3 if a worker stopped on a lost CUDA context (harness/isolate.py).  With
`--device cpu` the N workers are CPU processes (CI tests the merge that way); every worker
uses the same seed, so the verdicts equal a single run's.

SIGTERM or Ctrl-C: the workers get SIGTERM (each saves what it finished), the partial
results are merged and saved, marked "interrupted".  With --json the merged file is
rewritten every results.CHECKPOINT_S seconds from the workers' own checkpoints.

`pytest -n N` (pytest-xdist): conftest.py calls `xdist.pin_xdist_worker()` first thing, so worker
gwK sees only GPU K mod (number of GPUs).  Backends found through GRADORACLE_BACKENDS are
found by the workers too (they inherit the environment).  At the end of such a session the
controller prints "GPU per worker": each worker's pin, what torch saw there (device count, name,
UUID) and its test outcomes (`xdist.xdist_pin_report`, registered by conftest.py).

Checking a split run: `python -m harness.multi_gpu compare ONE.json TWO.json [--wall-one S
--wall-two S] [--json OUT]` compares a single run with a `--gpus N` run of the same selection and
seed (same (op, impl, case, dtype) rows, same status on each, rows per GPU and per worker, the
speedup; exit 0 only if identical, complete and spread over every worker), and `compare-junit
A.xml B.xml` two pytest sessions (`pytest -n 2` against `-n 1`, by --junitxml) test by test.
scripts/gpu_multi.sh runs both on a GPU host.
"""
