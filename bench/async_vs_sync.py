#!/usr/bin/env python3
"""Throughput of scheduled (async) executions against synchronous ones, in one run.

The program is ``examples/attention.hlo`` (causal multi-head self-attention, 256 tokens x
256 features, 4 heads). For each core set, the script alternates rounds of

- ``neuron-bench exec --exec-mode sync``: one caller thread per core, each waiting for
  its execution before starting the next (the baseline), and
- ``neuron-bench exec --exec-mode async --inflight K`` for each K: a single caller
  thread keeps K requests queued on every core's compute unit and sleeps in ``poll(2)``
  on the units' completion descriptors,

and reports each variant's median throughput over the rounds and its ratio to the sync
median of the same core set. Interleaving the rounds spreads any drift of the machine
over every variant alike.

How to run (from the repository root):

    cargo build --release -p neuron-profiler --bins
    python3 bench/async_vs_sync.py [--rounds 5] [--iterations 300] [--cores 0 --cores 0-1]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds (default 5)")
    parser.add_argument("--iterations", type=int, default=300, help="executions per core per variant per round (default 300)")
    parser.add_argument("--inflight", type=int, action="append", help="requests in flight per core (repeatable; default 1, 2, 4, 8)")
    parser.add_argument("--cores", action="append", help="core set to run on (repeatable; default 0 and 0-1)")
    parser.add_argument("--model", type=Path, default=ROOT / "examples" / "attention.hlo")
    parser.add_argument("--bin-dir", type=Path, default=ROOT / "target" / "release", help="where neuron-bench is")
    return parser.parse_args()


def run(bench, env, cores, iterations, mode, inflight):
    command = [str(bench), "exec", str(ARGS.model), "--cores", cores, "--iterations", str(iterations), "--json", "--exec-mode", mode]
    if mode == "async":
        command += ["--inflight", str(inflight)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout)["throughput_per_second"]


def main():
    bench = ARGS.bin_dir / "neuron-bench"
    if not bench.exists():
        sys.exit(f"{bench} does not exist; build it first: cargo build --release -p neuron-profiler --bins")
    inflights = ARGS.inflight or [1, 2, 4, 8]
    core_sets = ARGS.cores or ["0", "0-1"]
    with tempfile.TemporaryDirectory() as locks, tempfile.TemporaryDirectory(dir="/dev/shm") as datastores:
        # Private lock and datastore directories, so a runtime elsewhere on the host neither
        # blocks these cores nor is blocked by them.
        env = dict(os.environ, NEURON_VIRT_LOCK_DIR=locks, NEURON_VIRT_DATASTORE_DIR=datastores)
        variants = [("sync", None)] + [("async", k) for k in inflights]
        results = {(c, v): [] for c in core_sets for v in variants}
        for round_number in range(ARGS.rounds):
            for cores in core_sets:
                for mode, inflight in variants:
                    results[(cores, (mode, inflight))].append(run(bench, env, cores, ARGS.iterations, mode, inflight))
            print(f"round {round_number + 1}/{ARGS.rounds} done", file=sys.stderr)
    print(f"{ARGS.model.name}, {ARGS.rounds} rounds of {ARGS.iterations} executions per core per variant")
    print(f"{'cores':<8} {'variant':<18} {'executions/s':>13} {'ratio to sync':>14}")
    for cores in core_sets:
        baseline = statistics.median(results[(cores, ("sync", None))])
        for mode, inflight in variants:
            median = statistics.median(results[(cores, (mode, inflight))])
            label = "sync" if mode == "sync" else f"async inflight {inflight}"
            print(f"{cores:<8} {label:<18} {median:>13.1f} {median / baseline:>14.2f}")


ARGS = parse_args()

if __name__ == "__main__":
    main()
