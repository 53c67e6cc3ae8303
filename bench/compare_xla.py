#!/usr/bin/env python3
"""Time the same programs under XLA:CPU (through JAX) and under `neuron-bench`, in one run.

The programs, as the speed goals name them:

- ``mlp``: a two-layer MLP with ReLU, batch 64, 512 -> 2048 -> 512;
- ``attention``: causal multi-head self-attention, 256 tokens x 256 features, 4 heads;
- ``chain``: 20 element-wise operations on a 64x64 tensor;
- ``activations``: 12 element-wise operations mixing arithmetic with ``tanh``, ``exp``,
  ``logistic`` and ``log`` on 4096 elements;
- ``trig``: sines and cosines of 4096 elements, as rotary embeddings compute them;
- ``mlp_default`` and ``attention_default``: the MLP and attention compiled with
  neuron-cc's default options (matrix products auto-cast to bf16, as neuronx-cc does),
  against XLA's f32; their outputs are checked with a bf16 tolerance;
- ``cnn`` and ``cnn_grad``: a 2-layer CNN (3x3 convolutions, 16 and 32 channels, ReLU,
  NHWC) forward on ``f32[8,32,32,16]``, and its gradient with respect to both kernels;
- ``loop1`` and ``loop100``: a ``fori_loop`` of 1 and of 100 steps of a small
  matrix-vector update (``tanh(w @ v + b)``, 32x32); the script reports the time per
  iteration, ``(loop100 - loop1) / 99``, on each side;
- ``cumsum`` and ``cumprod``: ``jnp.cumsum`` along the rows of ``f32[64,1024]`` and
  ``jnp.cumprod`` down the columns of ``f32[256,64]`` (JAX lowers both to a
  ``reduce-window`` as long as the dimension);
- ``while``: a data-dependent ``while_loop`` with a small body (a damped update of
  ``f32[64]`` and a sum of absolute values per step, about 130 steps);
- ``sort`` and ``argsort``: ``jnp.sort`` and ``jnp.argsort`` along the rows of
  ``f32[128,16]``;
- ``small_cnn``: two 3x3 convolutions (8 and 16 channels), 2x2 max pooling and a dense
  layer on ``f32[32,12,12,1]`` images;
- ``gpt_step``: a GPT-style training step: token and position embeddings, one block of
  causal 4-head attention and an MLP with layer norms, tied output embedding, the loss
  and its gradient with respect to every weight (``value_and_grad``), 64 tokens, width 128;
- ``greedy``: 32 steps of greedy decoding (a matrix-vector product, ``argmax``, an
  embedding lookup per step) in a ``fori_loop``;
- ``power``: 50 steps of power iteration on ``f32[128,128]``;
- ``rnn``: a tanh RNN over 32 steps of ``f32[8,64]`` in a ``scan``;
- ``top_k``: ``lax.top_k`` of 8 along the rows of ``f32[128,256]``;
- ``int8_dot`` and ``bf16_dot``: ``s8[128,256] x s8[256,128]`` summed in s32, and an f32
  product whose operands are cast to bf16 inside the program.

Each program belongs to one of the classes the speed goals name (``loops``, ``scans``,
``sorts``, ``convolutions``, ``training``, ``products``, ``element-wise``); the script
prints each class's worst ratio and the geometric mean of all ratios.

For each program the script exports the HLO text JAX lowers it to, compiles it with
``neuron-cc compile --auto-cast none`` (so both sides compute in f32, as XLA:CPU does),
checks that one execution on virtual core nc0 matches XLA's output, then alternates
rounds: XLA, then ``neuron-bench exec``, several times, and reports each side's median
latency over all rounds and the ratio ours / XLA's.

What each side's latency covers:

- XLA: one call of the jitted function on arrays already on the device, until the
  result is ready, timed in Python. This includes JAX's Python dispatch, which the
  script measures on its own (a jitted ``negate`` of one float) and reports, with the
  ratio recomputed against XLA's latency minus that dispatch cost.
- neuron-bench: one synchronous ``Runtime::execute`` with bound input and output
  tensors (input DMA, every engine instruction, output DMA, the NaN/Inf check), as
  neuron-bench reports it.

XLA:CPU may use every host CPU for one program; a virtual NeuronCore computes on one
host thread. ``--xla-threads 1`` runs XLA single-threaded too.

How to run (from the repository root, outside CI: it needs jax):

    python3 -m venv /tmp/jaxenv && /tmp/jaxenv/bin/pip install "jax[cpu]==0.10.2"
    cargo build --release -p neuron-profiler --bins
    /tmp/jaxenv/bin/python bench/compare_xla.py [--rounds 5] [--iterations 400] [--xla-threads 1]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds per program (default 5)")
    parser.add_argument("--iterations", type=int, default=400, help="executions per side per round (default 400)")
    parser.add_argument("--xla-threads", type=int, default=0, help="limit XLA:CPU to this many threads (0: its default)")
    parser.add_argument("--bin-dir", type=Path, default=ROOT / "target" / "release", help="where neuron-cc and neuron-bench are")
    parser.add_argument("--only", action="append", help="run only this program (repeatable)")
    return parser.parse_args()


ARGS = parse_args()
os.environ["JAX_PLATFORMS"] = "cpu"
if ARGS.xla_threads:
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + f" --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads={ARGS.xla_threads}"
    )

import jax  # noqa: E402  (the environment above must be set first)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

# The same MLP and attention block as the demo's example models, at the sizes below.
sys.path.insert(0, str(ROOT / "examples"))
from gen_examples import attention, mlp  # noqa: E402


def chain(x):
    """Twenty element-wise operations; each one is an HLO instruction."""
    y = x * np.float32(0.5)  # 1
    y = y + np.float32(0.25)  # 2
    y = jnp.tanh(y)  # 3
    y = y * x  # 4
    y = y - np.float32(0.125)  # 5
    y = jnp.abs(y)  # 6
    y = jnp.sqrt(y)  # 7
    y = y + x  # 8
    y = jnp.exp(y)  # 9
    y = jnp.log1p(y)  # 10
    y = jnp.maximum(y, x)  # 11
    y = -y  # 12
    y = y * np.float32(1.5)  # 13
    y = jnp.minimum(y, np.float32(0.75))  # 14
    y = jnp.sin(y)  # 15
    y = y / np.float32(3.0)  # 16
    y = jax.nn.sigmoid(y)  # 17
    y = y - x  # 18
    y = jnp.cos(y)  # 19
    return y * y  # 20


def activations(x):
    """Arithmetic mixed with the activation engine's transcendental functions."""
    y = jnp.tanh(x * np.float32(1.5) + np.float32(0.25))
    y = jnp.exp(y - x) * np.float32(0.5)
    y = jax.nn.sigmoid(y + x)
    y = jnp.log(y + np.float32(1.0)) * x
    y = jnp.tanh(y) + jax.nn.sigmoid(x)
    return jnp.log(jnp.exp(y) + np.float32(2.0))


def trig(x):
    return jnp.sin(x * np.float32(3.0)) * jnp.cos(x) + jnp.cos(x * np.float32(0.5) + np.float32(1.0))


def cnn(x, w1, w2):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    return jax.nn.relu(jax.lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn))


def cnn_grad(x, w1, w2):
    return jax.grad(lambda w1, w2: cnn(x, w1, w2).sum(), argnums=(0, 1))(w1, w2)


def cumsum(x):
    return jnp.cumsum(x, axis=1)


def cumprod(x):
    return jnp.cumprod(1.0 + 0.001 * x, axis=0)


def fori(steps):
    def f(v, w, b):
        return jax.lax.fori_loop(0, steps, lambda i, v: jnp.tanh(w @ v + b), v)
    return f


def while_small(x):
    """Damped updates until the sum of |x| falls below 1 (or 1000 steps)."""

    def cond(state):
        i, x = state
        return (jnp.sum(jnp.abs(x)) > np.float32(1.0)) & (i < 1000)

    def body(state):
        i, x = state
        return i + 1, x * np.float32(0.97) - np.float32(0.001) * jnp.tanh(x)

    return jax.lax.while_loop(cond, body, (0, x))


def sort_rows(x):
    return jnp.sort(x, axis=1)


def argsort_rows(x):
    return jnp.argsort(x, axis=1)


def small_cnn(x, w1, w2, w3):
    dn = ("NHWC", "HWIO", "NHWC")
    h = jax.nn.relu(jax.lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
    h = jax.nn.relu(jax.lax.conv_general_dilated(h, w2, (1, 1), "SAME", dimension_numbers=dn))
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    return h.reshape(h.shape[0], -1) @ w3


def gpt_loss(params, tokens, targets):
    emb, pos, wq, wk, wv, wo, w1, w2, gain = params
    t, d, heads = tokens.shape[0], emb.shape[1], 4

    def norm(x):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) * jax.lax.rsqrt(v + np.float32(1e-5)) * gain

    def split(z):
        return z.reshape(t, heads, d // heads).transpose(1, 0, 2)

    x = emb[tokens] + pos
    h = norm(x)
    q, k, v = split(h @ wq), split(h @ wk), split(h @ wv)
    scores = jnp.einsum("htd,hsd->hts", q, k) / np.float32(np.sqrt(d // heads))
    scores = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool))[None], scores, np.float32(-1e9))
    att = jnp.einsum("hts,hsd->htd", jax.nn.softmax(scores, axis=-1), v).transpose(1, 0, 2).reshape(t, d)
    x = x + att @ wo
    x = x + jax.nn.relu(norm(x) @ w1) @ w2
    logits = norm(x) @ emb.T
    picked = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[:, None], axis=1)
    return -jnp.mean(picked)


def gpt_step(emb, pos, wq, wk, wv, wo, w1, w2, gain, tokens, targets):
    return jax.value_and_grad(gpt_loss)((emb, pos, wq, wk, wv, wo, w1, w2, gain), tokens, targets)


def greedy(h, emb, w, u):
    def step(i, state):
        h, tokens = state
        t = jnp.argmax(h @ w).astype(jnp.int32)
        return jnp.tanh(emb[t] + h @ u), tokens.at[i].set(t)

    return jax.lax.fori_loop(0, 32, step, (h, jnp.zeros(32, jnp.int32)))


def power(a, v):
    def step(i, v):
        w = a @ v
        return w / jnp.sqrt(jnp.sum(w * w))

    return jax.lax.fori_loop(0, 50, step, v)


def rnn(xs, h, wx, wh):
    def step(h, x):
        h = jnp.tanh(x @ wx + h @ wh)
        return h, h

    return jax.lax.scan(step, h, xs)


def top_k(x):
    return jax.lax.top_k(x, 8)


def int8_dot(a, b):
    return jax.lax.dot(a, b, preferred_element_type=jnp.int32)


def bf16_dot(a, b):
    return (a.astype(jnp.bfloat16) @ b.astype(jnp.bfloat16)).astype(jnp.float32)


# Each program's class, as the speed goals group them.
CLASSES = {
    "mlp": "products", "attention": "products", "mlp_default": "products", "attention_default": "products",
    "int8_dot": "products", "bf16_dot": "products", "chain": "element-wise", "activations": "element-wise",
    "trig": "element-wise", "cnn": "convolutions", "cnn_grad": "convolutions", "small_cnn": "convolutions",
    "loop1": "loops", "loop100": "loops", "while": "loops", "greedy": "loops", "power": "loops", "rnn": "loops",
    "cumsum": "scans", "cumprod": "scans", "sort": "sorts", "argsort": "sorts", "top_k": "sorts",
    "gpt_step": "training",
}

# Programs whose outputs are compared more loosely than f32's 1e-4 (relative to the
# output's largest magnitude): bf16 results, and sums of many products in another order.
TOLERANCES = {"bf16_dot": 2e-2, "gpt_step": 1e-3, "power": 1e-3}


def programs():
    rng = np.random.default_rng(20261121)

    def normal(*shape, scale=1.0):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def int8(*shape):
        return rng.integers(-128, 128, size=shape, dtype=np.int8)

    def tokens(n, vocab):
        return rng.integers(0, vocab, size=n, dtype=np.int32)

    spd = normal(128, 128)
    gpt = [normal(256, 128, scale=0.05), normal(64, 128, scale=0.05)] + [normal(128, 128, scale=0.08) for _ in range(4)]
    gpt += [normal(128, 512, scale=0.08), normal(512, 128, scale=0.04), np.ones(128, np.float32)]
    return {
        "mlp": (
            mlp,
            [normal(64, 512), normal(512, 2048, scale=0.04), normal(2048, scale=0.1), normal(2048, 512, scale=0.02), normal(512, scale=0.1)],
        ),
        "attention": (attention, [normal(256, 256)] + [normal(256, 256, scale=0.06) for _ in range(4)]),
        "chain": (chain, [normal(64, 64)]),
        "mlp_default": (
            mlp,
            [normal(64, 512), normal(512, 2048, scale=0.04), normal(2048, scale=0.1), normal(2048, 512, scale=0.02), normal(512, scale=0.1)],
        ),
        "attention_default": (attention, [normal(256, 256)] + [normal(256, 256, scale=0.06) for _ in range(4)]),
        "cnn": (cnn, [normal(8, 32, 32, 16), normal(3, 3, 16, 16, scale=0.1), normal(3, 3, 16, 32, scale=0.1)]),
        "cnn_grad": (cnn_grad, [normal(8, 32, 32, 16), normal(3, 3, 16, 16, scale=0.1), normal(3, 3, 16, 32, scale=0.1)]),
        "activations": (activations, [normal(4096)]),
        "trig": (trig, [normal(4096, scale=10.0)]),
        "loop1": (fori(1), [normal(32), normal(32, 32, scale=0.15), normal(32, scale=0.1)]),
        "loop100": (fori(100), [normal(32), normal(32, 32, scale=0.15), normal(32, scale=0.1)]),
        "cumsum": (cumsum, [normal(64, 1024)]),
        "cumprod": (cumprod, [normal(256, 64)]),
        "while": (while_small, [normal(64)]),
        "sort": (sort_rows, [normal(128, 16)]),
        "argsort": (argsort_rows, [normal(128, 16)]),
        "small_cnn": (small_cnn, [normal(32, 12, 12, 1), normal(3, 3, 1, 8, scale=0.3), normal(3, 3, 8, 16, scale=0.1),
                                  normal(576, 10, scale=0.05)]),
        "gpt_step": (gpt_step, gpt + [tokens(64, 256), tokens(64, 256)]),
        "greedy": (greedy, [normal(64), normal(128, 64, scale=0.3), normal(64, 128, scale=0.2), normal(64, 64, scale=0.15)]),
        "power": (power, [(spd + spd.T) / np.float32(2.0), normal(128)]),
        "rnn": (rnn, [normal(32, 8, 64), normal(8, 64), normal(64, 64, scale=0.1), normal(64, 64, scale=0.1)]),
        "top_k": (top_k, [normal(128, 256)]),
        "int8_dot": (int8_dot, [int8(128, 256), int8(256, 128)]),
        "bf16_dot": (bf16_dot, [normal(128, 256), normal(256, 128)]),
    }


def time_xla(jitted, args, iterations):
    samples = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        jax.block_until_ready(jitted(*args))
        samples.append(time.perf_counter_ns() - start)
    return samples


def run(cmd):
    result = subprocess.run(cmd, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"{' '.join(map(str, cmd))} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def neuron_bench(bench, neff, inputs, iterations, env, save=None):
    cmd = [bench, "exec", neff, "--cores", "0", "--iterations", str(iterations), "--json"]
    if save is None:
        # As XLA's side is timed after a warm-up, so is ours.
        cmd += ["--warmup", str(iterations)]
    for i, path in enumerate(inputs):
        cmd += ["--input", f"{i}={path}"]
    if save:
        cmd += ["--save-outputs", save]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        sys.exit(f"neuron-bench failed ({result.returncode}):\n{result.stderr}")
    return json.loads(result.stdout)


def main():
    cc, bench = ARGS.bin_dir / "neuron-cc", ARGS.bin_dir / "neuron-bench"
    for tool in (cc, bench):
        if not tool.exists():
            sys.exit(f"{tool} is missing; build it with `cargo build --release -p neuron-profiler --bins`")
    work = Path(tempfile.mkdtemp(prefix="compare-xla-"))
    env = dict(os.environ)
    # Private lock and datastore directories, so a run never collides with other runtimes.
    env.setdefault("NEURON_VIRT_LOCK_DIR", str(work / "locks"))
    env.setdefault("NEURON_VIRT_DATASTORE_DIR", str(work / "datastores"))

    print(f"jax {jax.__version__}, XLA:CPU threads: {ARGS.xla_threads or 'default'}, "
          f"{ARGS.rounds} rounds x {ARGS.iterations} executions per side", flush=True)
    negate = jax.jit(lambda v: -v)
    one = jax.device_put(np.ones(1, np.float32))
    jax.block_until_ready(negate(one))
    time_xla(negate, [one], 1000)
    dispatch = statistics.median(time_xla(negate, [one], 5000)) / 1e3
    print(f"JAX dispatch (jitted negate of f32[1]): median {dispatch:.1f} us\n", flush=True)

    header = f"{'program':<10} {'XLA median':>11} {'ours median':>12} {'ratio':>6} {'ratio without dispatch':>23}"
    rows = []
    for name, (fn, arrays) in programs().items():
        if ARGS.only and name not in ARGS.only:
            continue
        jitted = jax.jit(fn)
        hlo = work / f"{name}.hlo"
        hlo.write_text(jitted.lower(*arrays).as_text(dialect="hlo"))
        neff = work / f"{name}.neff"
        default_options = name.endswith("_default")
        run([cc, "compile", hlo, "-o", neff] + ([] if default_options else ["--auto-cast", "none"]))
        inputs = []
        for i, a in enumerate(arrays):
            path = work / f"{name}.input{i}.npy"
            np.save(path, a)
            inputs.append(path)

        device_args = [jax.device_put(a) for a in arrays]
        expected = [np.asarray(e) for e in jax.tree_util.tree_leaves(jitted(*device_args))]
        out_dir = work / f"{name}.out"
        neuron_bench(bench, neff, inputs, 1, env, save=out_dir)
        # bf16 products keep 8 bits of mantissa: compare relative to the output's scale.
        tolerance = 2e-2 if default_options else TOLERANCES.get(name, 1e-4)
        for k, e in enumerate(expected):
            got = np.load(out_dir / f"output{k}.npy")
            scale = max(float(np.max(np.abs(e))), 1.0) if e.size else 1.0
            if not np.allclose(got, e, rtol=tolerance, atol=tolerance * scale):
                worst = float(np.max(np.abs(got - e)))
                sys.exit(f"{name}: neuron-bench's output {k} differs from XLA's (max abs difference {worst})")

        time_xla(jitted, device_args, ARGS.iterations)  # warm-up
        xla, ours = [], []
        for _ in range(ARGS.rounds):
            xla += time_xla(jitted, device_args, ARGS.iterations)
            report = neuron_bench(bench, neff, inputs, ARGS.iterations, env)
            ours.append(report["latency_seconds"]["p50"] * 1e6)
        xla_median = statistics.median(xla) / 1e3
        ours_median = statistics.median(ours)
        ratio = ours_median / xla_median
        bare = ours_median / max(xla_median - dispatch, 1e-9)
        rows.append((name, xla_median, ours_median, ratio, bare))
        print(f"{name:<10} {xla_median:>8.1f} us {ours_median:>9.1f} us {ratio:>6.2f} {bare:>23.2f}", flush=True)

    print("\n" + header)
    for name, x, o, r, b in rows:
        print(f"{name:<10} {x:>8.1f} us {o:>9.1f} us {r:>6.2f} {b:>23.2f}")
    by_name = {name: (x, o) for name, x, o, _, _ in rows}
    if "loop1" in by_name and "loop100" in by_name:
        xla_step = (by_name["loop100"][0] - by_name["loop1"][0]) / 99
        ours_step = (by_name["loop100"][1] - by_name["loop1"][1]) / 99
        print(f"\nper loop iteration: XLA {xla_step:.2f} us, ours {ours_step:.2f} us, ratio {ours_step / xla_step:.2f}")
    worst = {}
    for name, _, _, ratio, _ in rows:
        cls = CLASSES.get(name, "other")
        if ratio > worst.get(cls, (None, 0.0))[1]:
            worst[cls] = (name, ratio)
    if rows:
        print("\nworst ratio per class (goal: each <= 1.5):")
        for cls, (name, ratio) in sorted(worst.items()):
            print(f"  {cls:<13} {ratio:>5.2f} ({name})")
        geomean = float(np.exp(np.mean([np.log(r) for _, _, _, r, _ in rows])))
        print(f"geometric mean of {len(rows)} ratios: {geomean:.2f} (goal: <= 1.0)")
    print("\n(ours: median of the per-round p50s of neuron-bench; XLA: median over every call)")


if __name__ == "__main__":
    main()
