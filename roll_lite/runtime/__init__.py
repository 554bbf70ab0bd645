"""Run-time plumbing of a run: what happens around the math.

    failures.py         WorkerError and the named outcomes of a worker that raised, died or hung
    importing.py        load_object: 'package.module:attribute' strings; one roll_lite tree per run
    metrics.py          metric reduction by name suffix (@sum, @mean, @max, @min)
    progress.py         progress bars on a terminal, log lines elsewhere
    reproducibility.py  `reproducible`: the kernels every process computes with
    signals.py          Ctrl-C and SIGTERM on the driver: a clean stop
    tracking.py         the run directory: config, metrics.jsonl, eval answers, wandb

Nothing is imported here.
"""
