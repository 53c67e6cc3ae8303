#!/usr/bin/env python3
"""Generate HLO test fixtures from small, real JAX programs.

For every case below this script writes a directory ``tests/data/jax/<case>/``
containing:

  model.hlo              HLO text of the jitted program, exactly as produced by
                         ``jax.jit(f).lower(*args).as_text(dialect="hlo")``.
  input0.npy, ...        the program arguments, in HLO parameter order.
  output0.npy, ...       the results XLA:CPU computed for those arguments
                         (``np.asarray(jax.jit(f)(*args))``); one file per tuple
                         element, in order, when the program returns a tuple.

The Rust runtime's integration tests parse ``model.hlo``, feed it the inputs and
compare against the outputs.

Constraints the fixtures are built to respect (checked by this script, which
fails loudly if JAX starts emitting something else):

  * only the HLO opcodes in ALLOWED_OPCODES below (those neuron-cc lowers);
  * reduce regions only use element-wise operations;
  * only the element types pred, s8, s16, s32, s64, u8, u16, u32, u64, f16, bf16
    and f32 (64-bit integers only in the cases listed in X64_CASES, which run with
    jax_enable_x64; nothing is ever f64);
  * every tensor file at most 64 KiB.

The inputs are deterministic (``np.random.default_rng`` with a fixed seed per
case) and every case directory is wiped and rewritten, so rerunning the script
reproduces the same files.

How to run (from the repository root):

    pip install "jax[cpu]==0.10.2"
    python3 tests/data/gen_jax_fixtures.py [CASE ...]   # all cases, or just those named

The fixtures checked in were produced with jax 0.10.2 / jaxlib 0.10.2.
"""

import os

# Force the CPU backend before JAX is imported (no GPU/TPU probing).
os.environ["JAX_PLATFORMS"] = "cpu"

import re
import shutil
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
from jax import lax
import numpy as np

jax.config.update("jax_platform_name", "cpu")
jax.config.update("jax_enable_x64", False)  # keep everything 32-bit

OUT_DIR = Path(__file__).resolve().parent / "jax"

ALLOWED_OPCODES = {
    "parameter", "constant", "dot", "add", "subtract", "multiply", "divide",
    "maximum", "minimum", "negate", "abs", "exponential", "log", "tanh",
    "logistic", "rsqrt", "sqrt", "broadcast", "reshape", "transpose", "reduce",
    "compare", "select", "convert", "iota", "concatenate", "slice", "call",
    "tuple", "get-tuple-element",
    "sine", "cosine", "exponential-minus-one", "log-plus-one", "floor", "ceil",
    "round-nearest-even", "round-nearest-afz", "sign", "power", "remainder",
    "atan2", "and", "or", "xor", "not", "shift-left", "shift-right-logical",
    "shift-right-arithmetic", "clamp", "reverse", "pad", "dynamic-slice",
    "dynamic-update-slice", "bitcast-convert", "gather", "scatter", "all-reduce",
    "all-gather", "select-and-scatter", "rng-bit-generator", "batch-norm-training",
    "batch-norm-inference", "batch-norm-grad", "while", "conditional",
    "is-finite", "cbrt", "tan", "erf", "popcnt", "count-leading-zeros", "topk",
    "reduce-window", "sort", "convolution", "opt-barrier",
}
# Reducers may use element-wise operations only.
ALLOWED_REDUCE_OPS = {"add", "maximum", "minimum", "multiply", "and", "or", "compare", "select",
                      "constant", "tuple", "subtract", "xor", "convert"}
ALLOWED_DTYPES = {"pred", "s8", "s16", "s32", "s64", "u8", "u16", "u32", "u64", "f16", "bf16", "f32"}
MAX_TENSOR_BYTES = 64 * 1024


# ---------------------------------------------------------------------------
# Input helpers
# ---------------------------------------------------------------------------

def normal(rng, shape, scale=0.5):
    """float32 normal samples of modest magnitude."""
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def weight(rng, fan_in, fan_out):
    """Dense-layer weight, scaled by 1/sqrt(fan_in) to keep activations O(1)."""
    return normal(rng, (fan_in, fan_out), scale=1.0 / np.sqrt(fan_in))


# ---------------------------------------------------------------------------
# Cases. Each returns (function, list of numpy arguments).
# ---------------------------------------------------------------------------

def case_mlp(rng):
    """x[8,32] -> dense(32->64) + relu -> dense(64->16)."""
    def f(x, w1, b1, w2, b2):
        h = jax.nn.relu(x @ w1 + b1)
        return h @ w2 + b2

    args = [
        normal(rng, (8, 32)),
        weight(rng, 32, 64), normal(rng, (64,), 0.1),
        weight(rng, 64, 16), normal(rng, (16,), 0.1),
    ]
    return f, args


def case_attention(rng):
    """Two-head causal self-attention block on x[16,32]."""
    seq, dim, heads = 16, 32, 2
    head_dim = dim // heads

    def f(x, wq, wk, wv, wo):
        def split(t):  # [seq, dim] -> [heads, seq, head_dim]
            return t.reshape(seq, heads, head_dim).transpose(1, 0, 2)

        q, k, v = split(x @ wq), split(x @ wk), split(x @ wv)
        scores = jnp.einsum("hqd,hkd->hqk", q, k) / jnp.sqrt(jnp.float32(head_dim))
        # Causal mask built inside the program (tril -> iota + compare).
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        scores = jnp.where(causal[None, :, :], scores, -jnp.inf)
        probs = jax.nn.softmax(scores, axis=-1)
        ctx = jnp.einsum("hqk,hkd->hqd", probs, v)  # [heads, seq, head_dim]
        ctx = ctx.transpose(1, 0, 2).reshape(seq, dim)
        return ctx @ wo

    args = [normal(rng, (seq, dim))] + [weight(rng, dim, dim) for _ in range(4)]
    return f, args


def case_gelu_ffn(rng):
    """x[8,32] -> dense(32->64) -> GELU (tanh approximation) -> dense(64->32)."""
    def f(x, w1, b1, w2, b2):
        h = jax.nn.gelu(x @ w1 + b1, approximate=True)
        return h @ w2 + b2

    args = [
        normal(rng, (8, 32)),
        weight(rng, 32, 64), normal(rng, (64,), 0.1),
        weight(rng, 64, 32), normal(rng, (32,), 0.1),
    ]
    return f, args


def case_rmsnorm(rng):
    """RMSNorm: x * rsqrt(mean(x^2, -1) + eps) * weight."""
    eps = 1e-6

    def f(x, w):
        ms = jnp.mean(x * x, axis=-1, keepdims=True)
        return x * jax.lax.rsqrt(ms + eps) * w

    args = [normal(rng, (8, 64)), (1.0 + normal(rng, (64,), 0.1)).astype(np.float32)]
    return f, args


def case_softmax_rows(rng):
    """jax.nn.softmax over the last axis of a [4,10] input."""
    def f(x):
        return jax.nn.softmax(x, axis=-1)

    return f, [normal(rng, (4, 10), scale=2.0)]


def case_batched_matmul(rng):
    """einsum 'bij,bjk->bik' (dot with batch dims), then transpose to [3,6,4]."""
    def f(a, b):
        c = jnp.einsum("bij,bjk->bik", a, b)
        return jnp.transpose(c, (0, 2, 1))

    return f, [normal(rng, (3, 4, 5)), normal(rng, (3, 5, 6))]


def case_int_ops(rng):
    """int32 / pred program; returns (s32[12], f32[12], pred[12], s32[])."""
    def f(x, flags):
        i = jnp.arange(12, dtype=jnp.int32)               # iota
        gt = x > i                                         # compare s32
        picked = jnp.where(gt, x, i)                       # select s32
        y = picked * 3 + i                                 # integer mul/add
        y = jnp.minimum(jnp.maximum(y, -5), 20)            # integer max/min
        y = jnp.where(flags, y, -y)                        # select on pred param
        as_float = y.astype(jnp.float32) * 0.5             # convert s32->f32
        # pred result via select (and/or/not opcodes are outside the subset)
        mask = jnp.where(flags, gt, x == 0)
        total = jnp.sum(y)                                 # s32 reduce-add
        return y, as_float, mask, total

    args = [
        rng.integers(-10, 10, size=(12,), dtype=np.int32),
        rng.integers(0, 2, size=(12,)).astype(np.bool_),
    ]
    return f, args


def case_slice_concat(rng):
    """Strided slice, concatenate, reshape, broadcast."""
    def f(x):
        a = x[::2, 1:5]                        # [3,4], strided slice
        b = x[1::2, 4:8]                       # [3,4]
        c = jnp.concatenate([a, b], axis=0)    # [6,4]
        d = jnp.concatenate([c, x[:, :2]], axis=1)  # [6,6]
        r = d.reshape(3, 12)                   # [3,12]
        tiled = jnp.broadcast_to(r, (2, 3, 12))      # broadcast to a new leading dim
        scaled = r[:, None, :] * x[:3, :2, None]     # [3,1,12] * [3,2,1] -> [3,2,12]
        return tiled, scaled

    return f, [normal(rng, (6, 8))]


def case_reduce_variants(rng):
    """max / min / sum / prod reductions over various axes of a [4,5,6] input."""
    def f(x):
        return (
            jnp.max(x, axis=0),          # [5,6]
            jnp.min(x, axis=(1, 2)),     # [4]
            jnp.sum(x, axis=(0, 2)),     # [5]
            jnp.prod(x, axis=-1),        # [4,5]
            jnp.sum(x),                  # []
        )

    return f, [normal(rng, (4, 5, 6), scale=1.0)]


def case_nested_call(rng):
    """Nested jax.jit functions, which lower to HLO `call` with to_apply=."""
    @jax.jit
    def innermost(x):
        return jnp.tanh(x) * 2.0

    @jax.jit
    def inner(x, y):
        return innermost(x) + y * 3.0

    def f(x, y):
        return inner(x, y) - inner(y, x) * 0.5

    return f, [normal(rng, (4, 6)), normal(rng, (4, 6))]


def case_special_constants(rng):
    """Constants inf / -inf / nan plus an array literal; outputs hold inf/nan."""
    lit = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], dtype=np.float32)

    def f(x):
        a = jnp.where(x > 0, x, -jnp.inf)          # constant(-inf); -inf in output
        b = jnp.where(x < -0.5, jnp.inf, x)        # constant(inf); +inf in output
        c = jnp.maximum(x, -jnp.inf)               # identity; finite
        d = jnp.where(x > 0.5, jnp.nan, x)         # constant(nan); nan in output
        e = x + lit                                # array-literal constant
        g = jnp.log(jnp.maximum(x, 0.0))           # -inf computed at run time
        return a, b, c, d, e, g

    return f, [normal(rng, (3, 2), scale=1.0)]


def check_special_constants(outs):
    """The point of this case is non-finite values: make sure they occur."""
    allv = np.concatenate([o.ravel() for o in outs])
    assert np.isposinf(allv).any(), "no +inf in outputs"
    assert np.isneginf(allv).any(), "no -inf in outputs"
    assert np.isnan(allv).any(), "no nan in outputs"
    assert np.isfinite(allv).any(), "no finite values in outputs"


# (case name, builder, rng seed)
def case_float_math(rng):
    """Transcendental, rounding and two-operand float functions on f32[6,8]."""
    def f(x, y):
        pos = jnp.abs(y) + 0.25  # a positive divisor / exponent base
        return (
            jnp.sin(x) + jnp.cos(y),
            jnp.expm1(x * 0.1) - jnp.log1p(jnp.abs(y)),
            jnp.floor(x * 3.0) + jnp.ceil(y * 3.0),
            jnp.round(x * 4.0),  # half-way cases to even
            lax.round(y * 4.0, lax.RoundingMethod.AWAY_FROM_ZERO),
            jnp.sign(x) * jnp.sign(y),
            lax.pow(pos, x),
            lax.rem(x * 5.0, pos),  # C fmod: the dividend's sign
            jnp.arctan2(x, y),
        )

    x = normal(rng, (6, 8), 2.0)
    y = normal(rng, (6, 8), 2.0)
    # Exact half-way points and signed zeros, where rounding and sign differ.
    x[0, :8] = np.array([0.125, -0.125, 0.375, -0.375, 0.0, -0.0, 0.625, 2.5], np.float32)
    y[0, :8] = np.array([0.125, -0.125, 0.375, -0.375, -0.0, 0.0, -0.625, -2.5], np.float32)
    return f, [x, y]


def case_integer_bits(rng):
    """Bitwise logic, the three shifts (amounts past the bit width and negative
    ones included), remainder (by zero and MIN % -1 included) and sign on s32."""
    def f(a, b, n):
        return (
            (a & b) ^ (~a | b),
            lax.shift_left(a, n),
            lax.shift_right_logical(a, n),
            lax.shift_right_arithmetic(a, n),
            lax.rem(a, b),
            jnp.sign(a) * 3,
        )

    a = rng.integers(-2**31, 2**31, size=(4, 16), dtype=np.int64).astype(np.int32)
    b = rng.integers(-50, 50, size=(4, 16)).astype(np.int32)
    n = rng.integers(-3, 40, size=(4, 16)).astype(np.int32)
    b[0, :4] = [0, 0, -1, 7]
    a[0, :4] = [5, -5, np.iinfo(np.int32).min, 0]
    n[0, :6] = [0, 31, 32, 33, -1, 1]
    return f, [a, b, n]


def case_pred_logic(rng):
    """and, or, xor and not on pred, from comparisons."""
    def f(x, y):
        p, q = x > 0, y > 0
        return (p & q) | ~(p ^ q), jnp.logical_xor(p, ~q)

    return f, [normal(rng, (5, 7)), normal(rng, (5, 7))]


def ints(rng, dtype, shape, low=None, high=None):
    """Integers spread over most of dtype's range (or [low, high))."""
    info = np.iinfo(dtype)
    low = info.min // 2 if low is None else low
    high = info.max // 2 if high is None else high
    return rng.integers(low, high, size=shape, dtype=np.int64).astype(dtype)


def case_narrow_ints(rng):
    """s8 / s16 / u8 / u16 / u32 arithmetic that wraps, divides by zero, shifts and
    converts between widths."""
    def f(a8, b8, a16, b16, u8, v8, u16, u32, v32):
        s8 = (a8 * b8 + a8, a8 // jnp.where(b8 == 0, 1, b8), lax.rem(a8, b8), jnp.maximum(a8, b8))
        s16 = (a16 - b16, a16 >> 3, lax.shift_right_logical(a16, jnp.int16(2)),
               lax.div(a16, b16), jnp.abs(a16), jnp.sign(b16))
        uns8 = (u8 + v8, u8 * v8, lax.div(u8, v8), lax.rem(u8, v8), u8 >> 2, ~u8, jnp.minimum(u8, v8))
        uns16 = (u16 << 3, u16.astype(jnp.int8), u16.astype(jnp.float32))
        uns32 = (u32 ^ v32, lax.shift_right_arithmetic(u32, jnp.uint32(4)), u32 // jnp.maximum(v32, 1),
                 (u32 > v32), u32.astype(jnp.int16), jnp.sum(u32, dtype=jnp.uint32))
        return (*s8, *s16, *uns8, *uns16, *uns32, a8.astype(jnp.uint16), b16.astype(jnp.uint8))

    b8 = ints(rng, np.int8, (24,))
    b8[:3] = 0
    v8 = ints(rng, np.uint8, (24,), 0, 256)
    v8[:2] = 0
    b16 = ints(rng, np.int16, (24,))
    b16[5] = 0
    args = [
        ints(rng, np.int8, (24,)), b8,
        ints(rng, np.int16, (24,)), b16,
        ints(rng, np.uint8, (24,), 0, 256), v8,
        ints(rng, np.uint16, (24,), 0, 65536),
        ints(rng, np.uint32, (24,), 0, 2**32), ints(rng, np.uint32, (24,), 0, 2**32),
    ]
    return f, args


def case_wide_ints(rng):
    """Real 64-bit integers (s64, u64): products and sums past 2^32, shifts past 32
    bits, and conversions to and from narrower types. Generated with jax_enable_x64."""
    def f(a, b, u, v):
        return (a * b + a, a // jnp.where(b == 0, 1, b), a >> 40, lax.shift_right_logical(a, jnp.int64(60)),
                a << 33, jnp.sum(a), jnp.max(b), u * v, u >> 35, u // jnp.maximum(v, 1),
                u.astype(jnp.int64), a.astype(jnp.int32), a.astype(jnp.float32), (a < b),
                u.astype(jnp.uint32), jnp.arange(6, dtype=jnp.int64) * jnp.int64(3_000_000_000))

    args = [
        ints(rng, np.int64, (16,), -(2**40), 2**40), ints(rng, np.int64, (16,), -(2**31), 2**31),
        ints(rng, np.int64, (16,), 0, 2**62).astype(np.uint64) * np.uint64(2),
        ints(rng, np.int64, (16,), 0, 2**40).astype(np.uint64),
    ]
    return f, args


def case_half_floats(rng):
    """f16 element-wise math, a reduction (JAX accumulates in f32) and conversions,
    including values that overflow f16 to infinity."""
    def f(x, y):
        big = x * jnp.float16(3000.0)
        return (x + y, x * y, x / (jnp.abs(y) + jnp.float16(0.5)), jnp.exp(x), jnp.tanh(y),
                jax.nn.sigmoid(x), jnp.sqrt(jnp.abs(x)), jnp.sum(x, axis=1), jnp.max(y, axis=0),
                big * big, x.astype(jnp.float32), (x > y), jnp.floor(x * jnp.float16(4.0)),
                x.astype(jnp.int16), x.astype(jnp.bfloat16))

    return f, [normal(rng, (8, 16)).astype(np.float16), normal(rng, (8, 16)).astype(np.float16)]


def case_bf16_matmul(rng):
    """bf16 matrix products: bf16 result, f32 result (preferred_element_type), and a
    bf16 MLP layer with bias, GELU and a row softmax."""
    import ml_dtypes

    def f(x, w, b, w2):
        h = jax.nn.gelu(x @ w + b)
        wide = jnp.dot(x, w, preferred_element_type=jnp.float32)
        logits = h @ w2
        return h, wide, jax.nn.softmax(logits.astype(jnp.float32), axis=-1), jnp.sum(h, axis=0)

    bf = ml_dtypes.bfloat16
    args = [normal(rng, (16, 32)).astype(bf), weight(rng, 32, 48).astype(bf),
            normal(rng, (48,), 0.1).astype(bf), weight(rng, 48, 8).astype(bf)]
    return f, args


def case_convert_matrix(rng):
    """convert from each of f32, s32, u8, bf16 and pred to every other element type."""
    types = [jnp.bool_, jnp.int8, jnp.int16, jnp.int32, jnp.uint8, jnp.uint16, jnp.uint32,
             jnp.float16, jnp.bfloat16, jnp.float32]

    def f(x, i, u, h, p):
        return tuple(a.astype(t) for a in (x, i, u, h, p) for t in types if a.dtype != t)

    import ml_dtypes
    x = (rng.standard_normal(20) * 200).astype(np.float32)
    x[:4] = [np.nan, np.inf, -np.inf, 1e10]
    return f, [x, ints(rng, np.int32, (20,)), ints(rng, np.uint8, (20,), 0, 256),
               (rng.standard_normal(20) * 50).astype(ml_dtypes.bfloat16), rng.random(20) < 0.5]


def case_layer_norm(rng):
    """LayerNorm over the last axis with learned scale and bias."""
    def f(x, g, b):
        mean = jnp.mean(x, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
        return (x - mean) * lax.rsqrt(var + 1e-5) * g + b

    return f, [normal(rng, (8, 64), 1.0), 1.0 + normal(rng, (64,), 0.1), normal(rng, (64,), 0.1)]


def case_rotary_embedding(rng):
    """Rotary position embeddings (RoPE) on q[16, 4, 32]: sin/cos tables from iota,
    half-rotation by slicing, negation and concatenation."""
    seq, heads, dim = 16, 4, 32

    def f(q):
        inv = 1.0 / (10000.0 ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))
        angles = jnp.arange(seq, dtype=jnp.float32)[:, None] * inv[None, :]
        sin = jnp.concatenate([jnp.sin(angles)] * 2, axis=-1)[:, None, :]
        cos = jnp.concatenate([jnp.cos(angles)] * 2, axis=-1)[:, None, :]
        rotated = jnp.concatenate([-q[..., dim // 2:], q[..., :dim // 2]], axis=-1)
        return q * cos + rotated * sin

    return f, [normal(rng, (seq, heads, dim), 1.0)]


def case_embedding_gather(rng):
    """Embedding lookup table[ids] (gather of rows), jnp.take along an axis, and
    take_along_axis (a gather with two index components)."""
    def f(table, ids, cols):
        rows = table[ids]
        picked = jnp.take(table, cols, axis=1)
        along = jnp.take_along_axis(table, cols[None, :3].repeat(table.shape[0], 0), axis=1)
        return rows, picked, along

    return f, [normal(rng, (50, 16), 1.0), rng.integers(0, 50, size=(4, 6)).astype(np.int32),
               rng.integers(0, 16, size=(5,)).astype(np.int32)]


def case_scatter_updates(rng):
    """Scatter with add (repeated indices accumulate), max, min, multiply and set, and a
    segment sum."""
    def f(x, idx, v, seg):
        return (x.at[idx].add(v), x.at[idx].max(v), x.at[idx].min(v), x.at[idx].multiply(v),
                x.at[idx].set(v), jax.ops.segment_sum(v, seg, num_segments=5))

    idx = np.array([0, 3, 3, 7, 1, 9], dtype=np.int32)
    seg = np.array([0, 0, 1, 4, 4, 4], dtype=np.int32)
    return f, [normal(rng, (10, 4), 1.0), idx, normal(rng, (6, 4), 1.0), seg]


def case_mlp_grad(rng):
    """Gradient of a two-layer MLP's squared-error loss from jax.grad, with respect to
    every weight: transposed matrix products, ReLU masks, broadcasts and reductions."""
    def loss(params, x, y):
        w1, b1, w2, b2 = params
        h = jax.nn.relu(x @ w1 + b1)
        return jnp.mean(jnp.square(h @ w2 + b2 - y))

    def f(w1, b1, w2, b2, x, y):
        return jax.grad(loss)((w1, b1, w2, b2), x, y)

    return f, [weight(rng, 16, 32), normal(rng, (32,), 0.1), weight(rng, 32, 8), normal(rng, (8,), 0.1),
               normal(rng, (12, 16), 1.0), normal(rng, (12, 8), 1.0)]


def case_pad_reverse(rng):
    """Constant and edge padding, lax.pad with interior and negative padding, flips,
    strided slices and concatenation."""
    def f(x):
        return (jnp.pad(x, ((1, 2), (0, 3))), jnp.pad(x, ((2, 0), (1, 1)), mode="edge"),
                lax.pad(x, jnp.float32(-1.0), ((1, -2, 1), (-1, 2, 2))), jnp.flip(x, axis=0),
                jnp.flip(x), jnp.concatenate([x[::2], jnp.flip(x[1::2], axis=1)], axis=0))

    return f, [normal(rng, (6, 5), 1.0)]


def case_dynamic_slices(rng):
    """lax.dynamic_slice and dynamic_update_slice with indices computed at run time,
    including starts past the end, which XLA clamps."""
    def f(x, u, i, j):
        return (lax.dynamic_slice(x, (i, j), (3, 4)), lax.dynamic_slice(x, (i + 10, j - 7), (2, 2)),
                lax.dynamic_update_slice(x, u, (j, i)), lax.dynamic_update_slice(x, u * 2.0, (i + 50, j)),
                lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False))

    return f, [normal(rng, (8, 10), 1.0), normal(rng, (2, 3), 1.0), np.int32(2), np.int32(5)]


def case_batch_norm(rng):
    """Batch normalisation in training mode over [N, H, W, C] (statistics over N, H and
    W) and in inference mode from running statistics."""
    def f(x, gamma, beta, mean, var):
        m = jnp.mean(x, axis=(0, 1, 2))
        v = jnp.var(x, axis=(0, 1, 2))
        train = (x - m) * lax.rsqrt(v + 1e-5) * gamma + beta
        infer = (x - mean) * lax.rsqrt(var + 1e-5) * gamma + beta
        return train, infer, m, v

    return f, [normal(rng, (4, 5, 5, 8), 1.0), 1.0 + normal(rng, (8,), 0.1), normal(rng, (8,), 0.1),
               normal(rng, (8,), 0.1), 1.0 + np.abs(normal(rng, (8,), 0.1))]


def case_random_numbers(rng):
    """Counter-based random numbers from a seed passed in: PCG-style u32 hashing
    (multiply, xor, shifts), mantissa bits bitcast to uniform floats in [0, 1), normal
    samples by Box-Muller and a Bernoulli mask. (jax.random's threefry lowers to a
    `while` loop on CPU, which neuron-cc does not lower.)"""
    def hash32(x):
        x = x * jnp.uint32(747796405) + jnp.uint32(2891336453)
        word = ((x >> ((x >> 28) + jnp.uint32(4))) ^ x) * jnp.uint32(277803737)
        return (word >> 22) ^ word

    def uniform(seed, shape, stream):
        counter = lax.iota(jnp.uint32, int(np.prod(shape))).reshape(shape)
        bits = hash32(hash32(counter ^ seed) + jnp.uint32(stream))
        return lax.bitcast_convert_type((bits >> 9) | jnp.uint32(0x3F800000), jnp.float32) - 1.0

    def f(seed):
        u1, u2 = uniform(seed, (16,), 1), uniform(seed, (16,), 2)
        normal = jnp.sqrt(-2.0 * jnp.log1p(-u1)) * jnp.cos(2.0 * np.pi * u2)
        return uniform(seed, (6, 8), 3), normal, hash32(seed + lax.iota(jnp.uint32, 10)), uniform(seed, (12,), 4) < 0.3

    return f, [np.uint32(20261121)]


def case_clamp_bitcast(rng):
    """lax.clamp with scalar and array bounds, jnp.clip, and bitcast-convert between
    f32, s32 and u32 (and f16 / s16)."""
    def f(x, lo, h):
        return (lax.clamp(jnp.float32(-0.5), x, jnp.float32(0.5)), lax.clamp(lo, x, lo + 1.0),
                jnp.clip(x, -1.0, None), lax.bitcast_convert_type(x, jnp.int32),
                lax.bitcast_convert_type(x, jnp.uint32) >> 23, lax.bitcast_convert_type(h, jnp.int16),
                lax.bitcast_convert_type(lax.bitcast_convert_type(x, jnp.int32) + 1, jnp.float32))

    return f, [normal(rng, (4, 6), 1.0), normal(rng, (4, 6), 0.5), normal(rng, (4, 6)).astype(np.float16)]


def case_batched_gather_scatter(rng):
    """vmap of per-row indexing and of a per-row scatter-add: gather and scatter with
    operand batching dimensions."""
    def f(x, idx):
        picked = jax.vmap(lambda row, i: row[i])(x, idx)
        added = jax.vmap(lambda row, i, v: row.at[i].add(v))(x, idx, picked * 2.0)
        return picked, added

    return f, [normal(rng, (4, 7), 1.0), rng.integers(0, 7, size=(4, 3)).astype(np.int32)]


def case_single_core_collectives(rng):
    """psum and all_gather inside shard_map over a one-device mesh: all-reduce and
    all-gather with a single replica, which return their operand."""
    from jax.sharding import Mesh, PartitionSpec as P

    mesh = Mesh(np.array(jax.devices()[:1]), ("d",))

    def body(a):
        return jax.lax.psum(a, "d") * 2.0, jax.lax.all_gather(a, "d", tiled=True) + 1.0

    f = jax.shard_map(body, mesh=mesh, in_specs=P("d"), out_specs=(P(), P()), check_vma=False)
    return f, [normal(rng, (4, 6), 1.0)]


def case_argmax(rng):
    """jnp.argmax / argmin (variadic reduce of values and indices, with an index
    tie-break), over rows, columns and an integer array, plus lax.reduce of two arrays
    at once with a sum and a maximum."""
    def f(x, n):
        x = x.at[1, 3].set(jnp.nan)  # argmax picks the first NaN, as XLA does
        both = lax.reduce((x[2:], n.astype(jnp.float32)[:, :x.shape[1]]), (jnp.float32(0), jnp.float32(-jnp.inf)),
                          lambda a, b: (a[0] + b[0], jnp.maximum(a[1], b[1])), (1,))
        return jnp.argmax(x, axis=1), jnp.argmin(x, axis=0), jnp.argmax(n, axis=0), both[0], both[1]

    x = normal(rng, (6, 10), 1.0)
    x[4, 2] = x[4, 7] = 5.0  # a tie: the lower index wins
    return f, [x, rng.integers(-50, 50, size=(4, 12)).astype(np.int32)]


def _select_and_scatter_add(source, operand, strides, window, padding):
    from jax._src.lax.windowed_reductions import _select_and_scatter_add as op
    return op(source, operand, lax.ge_p, window, strides, padding)


def case_max_pool_grad(rng):
    """select-and-scatter as the gradient of max pooling: 2x2 windows with stride 2,
    and overlapping padded 3x3 windows with stride 2."""
    def f(x, g1, g2):
        plain = _select_and_scatter_add(g1, x, (1, 2, 2, 1), (1, 2, 2, 1), ((0, 0),) * 4)
        padded = _select_and_scatter_add(g2, x, (1, 2, 2, 1), (1, 3, 3, 1), ((0, 0), (1, 1), (1, 1), (0, 0)))
        return plain, padded

    return f, [normal(rng, (2, 8, 8, 3), 1.0), normal(rng, (2, 4, 4, 3), 1.0), normal(rng, (2, 4, 4, 3), 1.0)]


def _hlo_primitive(name, results, lower):
    """A JAX primitive lowered straight to one StableHLO operation, for HLO operators
    JAX itself never emits (the batch-norm family)."""
    from jax._src import core
    from jax.extend.core import Primitive
    from jax.interpreters import mlir

    prim = Primitive(name)
    prim.multiple_results = True
    prim.def_abstract_eval(lambda *args, **params: tuple(
        core.ShapedArray(args[i].shape, args[i].dtype) for i in results))
    mlir.register_lowering(prim, lambda ctx, *args, **params: lower(*args, **params).results)
    return prim


def _batch_norm_primitives():
    from jax._src.lib.mlir import ir
    from jax._src.lib.mlir.dialects import hlo as stablehlo

    def attrs(epsilon, feature_index):
        return (ir.FloatAttr.get(ir.F32Type.get(), epsilon),
                ir.IntegerAttr.get(ir.IntegerType.get_signless(64), feature_index))

    training = _hlo_primitive("batch_norm_training", (0, 1, 1), lambda x, s, o, *, epsilon, feature_index:
                              stablehlo.BatchNormTrainingOp(x, s, o, *attrs(epsilon, feature_index)))
    inference = _hlo_primitive("batch_norm_inference", (0,), lambda x, s, o, m, v, *, epsilon, feature_index:
                               stablehlo.BatchNormInferenceOp(x, s, o, m, v, *attrs(epsilon, feature_index)))
    grad = _hlo_primitive("batch_norm_grad", (0, 1, 1), lambda x, s, m, v, g, *, epsilon, feature_index:
                          stablehlo.BatchNormGradOp(x, s, m, v, g, *attrs(epsilon, feature_index)))
    return training, inference, grad


def case_batch_norm_ops(rng):
    """The HLO batch-norm operators (batch-norm-training, -inference and -grad), over
    NHWC with the feature last and over NCHW with the feature at index 1."""
    training, inference, grad = _batch_norm_primitives()

    def f(x, scale, offset, mean, var, dy, y):
        out, m, v = training.bind(x, scale, offset, epsilon=1e-3, feature_index=3)
        (inf,) = inference.bind(x, scale, offset, mean, var, epsilon=1e-5, feature_index=3)
        dx, dscale, doffset = grad.bind(x, scale, m, v, dy, epsilon=1e-3, feature_index=3)
        out1, m1, v1 = training.bind(y, scale, offset, epsilon=1e-3, feature_index=1)
        return out, m, v, inf, dx, dscale, doffset, out1, m1, v1

    return f, [normal(rng, (4, 5, 5, 8), 1.0) + 0.5, 1.0 + normal(rng, (8,), 0.1), normal(rng, (8,), 0.1),
               normal(rng, (8,), 0.1), 1.0 + np.abs(normal(rng, (8,), 0.1)), normal(rng, (4, 5, 5, 8), 1.0),
               normal(rng, (3, 8, 4, 4), 2.0)]


def case_rng_bit_generator(rng):
    """lax.rng_bit_generator with the Philox and Threefry algorithms and XLA's
    default, for 8-, 16-, 32- and 64-bit outputs of awkward sizes; the new states too."""
    def f(key):
        outs = []
        for algorithm in (lax.RandomAlgorithm.RNG_PHILOX, lax.RandomAlgorithm.RNG_THREE_FRY,
                          lax.RandomAlgorithm.RNG_DEFAULT):
            new_key, bits = lax.rng_bit_generator(key, (5, 7), dtype=jnp.uint32, algorithm=algorithm)
            next_key, wide = lax.rng_bit_generator(new_key, (3,), dtype=jnp.uint64, algorithm=algorithm)
            _, narrow = lax.rng_bit_generator(next_key, (2, 6), dtype=jnp.uint16, algorithm=algorithm)
            _, scalar = lax.rng_bit_generator(next_key, (), dtype=jnp.uint8, algorithm=algorithm)
            outs += [new_key, bits, wide, narrow, scalar]
        return tuple(outs)

    return f, [np.array([0x12345678, 0x9abcdef0, 0x0fedcba9, 0x87654321], dtype=np.uint32)]


def case_jax_random(rng):
    """jax.random with the `unsafe_rbg` generator (rng-bit-generator underneath):
    uniform floats, normal samples, integers in a range and a Bernoulli mask, from a
    key passed in."""
    def f(key_data):
        key = jax.random.wrap_key_data(key_data, impl="unsafe_rbg")
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return (jax.random.uniform(k1, (6, 8)), jax.random.normal(k2, (16,)),
                jax.random.randint(k3, (10,), -5, 17), jax.random.bernoulli(k4, 0.3, (12,)))

    key = jax.random.key_data(jax.random.key(20261121, impl="unsafe_rbg"))
    return f, [np.asarray(key)]


def case_fori_loop(rng):
    """A 100-step fori_loop: a small matrix-vector update whose step uses the loop
    index, and a loop inside the loop (a 3-step inner fori_loop per outer step)."""
    def f(x, w):
        def step(i, v):
            inner = lax.fori_loop(0, 3, lambda j, u: u * 0.5 + jnp.float32(j), v[:2])
            return jnp.tanh(w @ v + i.astype(jnp.float32) * 1e-2) + inner.sum() * 1e-3
        return lax.fori_loop(0, 100, step, x)

    return f, [normal(rng, (8,)), weight(rng, 8, 8)]


def case_while_tolerance(rng):
    """Newton's square root in a while_loop that stops when every residual is below a
    tolerance (a data-dependent trip count), returning the root and the count."""
    def f(a):
        def cond(state):
            x, it = state
            return (jnp.max(jnp.abs(x * x - a)) > 1e-4) & (it < 50)

        def body(state):
            x, it = state
            return 0.5 * (x + a / x), it + 1

        return lax.while_loop(cond, body, (a, jnp.int32(0)))

    return f, [np.abs(normal(rng, (6,), 30.0)) + 1.0]


def case_scan_rnn(rng):
    """A tanh RNN over 12 steps with lax.scan: carried state, stacked outputs and a
    loop-invariant weight pair."""
    def f(h0, xs, wx, wh):
        def step(h, x):
            h = jnp.tanh(x @ wx + h @ wh)
            return h, h.sum()
        return lax.scan(step, h0, xs)

    return f, [normal(rng, (4, 16)), normal(rng, (12, 4, 8)), weight(rng, 8, 16), weight(rng, 16, 16)]


def case_cond_switch(rng):
    """lax.cond on a predicate computed from data, returning a tuple, and lax.switch
    over three branches with an index (in range and clamped)."""
    def f(x, i):
        c = lax.cond(x.sum() > 0, lambda v: (v * 3.0, v.max()), lambda v: (v - 1.0, v.min()), x)
        branches = [lambda v: v + 1.0, lambda v: jnp.exp(v), lambda v: -v]
        return c, lax.switch(i, branches, x), lax.switch(i + 5, branches, x)

    return f, [normal(rng, (5,)), np.int32(1)]


def case_jax_random_default(rng):
    """jax.random with the default generator (threefry2x32): uniform floats, normal
    samples, integers in a range, a and a Bernoulli
    mask, from a key passed in."""
    def f(key_data):
        key = jax.random.wrap_key_data(key_data)
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return (jax.random.uniform(k1, (6, 8)), jax.random.normal(k2, (16,)),
                jax.random.randint(k3, (10,), -5, 17), jax.random.bernoulli(k4, 0.3, (12,)))

    return f, [np.asarray(jax.random.key_data(jax.random.key(20261125)))]


def case_more_elementwise(rng):
    """logsumexp (is-finite underneath) and a cross-entropy from it, exact GELU (erf),
    cbrt, tan, population count and leading zeros, including infinities and NaN."""
    def f(logits, labels, x, n):
        lse = jax.nn.logsumexp(logits, axis=-1)
        picked = jnp.take_along_axis(logits, labels[:, None], axis=-1)[:, 0]
        loss = jnp.mean(lse - picked)
        return (loss, jax.nn.gelu(x, approximate=False), lax.erf(x), jnp.cbrt(x), jnp.tan(x),
                jnp.isfinite(x), lax.population_count(n), lax.clz(n))

    x = normal(rng, (40,), 2.0)
    x[:3] = [np.inf, -np.inf, np.nan]
    n = rng.integers(-2**31, 2**31 - 1, size=(16,), dtype=np.int64).astype(np.int32)
    n[:2] = [0, -1]
    return f, [normal(rng, (8, 10), 3.0), rng.integers(0, 10, size=(8,)).astype(np.int32), x, n]


def case_top_k(rng):
    """lax.top_k over rows with ties, NaN, infinities and signed zeros; over integers;
    and a top-k sampling step (softmax over the k best logits, then a categorical
    draw by inverse CDF from a uniform number passed in)."""
    def f(x, n, logits, u):
        values, indices = lax.top_k(x, 5)
        ivalues, iindices = lax.top_k(n, 3)
        best, ids = lax.top_k(logits, 8)
        probs = jax.nn.softmax(best, axis=-1)
        choice = jnp.sum(jnp.cumsum(probs, axis=-1) < u[:, None], axis=-1)
        sampled = jnp.take_along_axis(ids, choice[:, None], axis=-1)[:, 0]
        return values, indices, ivalues, iindices, sampled

    x = np.round(normal(rng, (6, 12), 2.0))  # many ties
    x[0, :4] = [np.nan, np.inf, -np.inf, 0.0]
    x[1, :3] = [-0.0, 0.0, -0.0]
    n = rng.integers(-5, 5, size=(4, 7)).astype(np.int32)
    return f, [x, n, normal(rng, (3, 50), 2.0), rng.uniform(size=(3,)).astype(np.float32)]


def case_windows(rng):
    """reduce-window: cumsum, cumprod, cummax and cummin along each axis; max and
    average pooling (VALID and SAME, strided); a window with base and window
    dilation; an integer sum; and a two-array arg-max over windows."""
    def f(x, img, n):
        dilated = lax.reduce_window(x, 0.0, lax.add, (2, 2), (1, 1), [(1, 1), (0, 2)],
                                    base_dilation=(2, 1), window_dilation=(1, 2))
        maxpool = lax.reduce_window(img, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        avgpool = lax.reduce_window(img, 0.0, lax.add, (1, 3, 3, 1), (1, 2, 2, 1), "SAME") / 9.0
        iota = lax.broadcasted_iota(jnp.int32, x.shape, 1)

        def argmax_pair(a, b):
            (va, ia), (vb, ib) = a, b
            take_b = (vb > va) | ((vb == va) & (ib < ia))
            return jnp.where(take_b, vb, va), jnp.where(take_b, ib, ia)

        wmax, warg = lax.reduce_window((x, iota), (-jnp.inf, jnp.int32(0)), argmax_pair, (1, 3), (1, 1), "VALID")
        return (jnp.cumsum(x, axis=1), jnp.cumsum(x, axis=0), jnp.cumprod(x * 0.5 + 1.0, axis=1),
                lax.cummax(x, axis=1), lax.cummin(x, axis=0), dilated, maxpool, avgpool,
                jnp.cumsum(n, axis=0), wmax, warg)

    return f, [normal(rng, (6, 9)), normal(rng, (2, 8, 8, 3)), rng.integers(-9, 9, size=(5, 4)).astype(np.int32)]


def case_transformer_train_step(rng):
    """One training step of a one-layer transformer language model: token embeddings
    (a gather), causal self-attention, exact GELU, layer norm, a logsumexp
    cross-entropy, value_and_grad through all of it, and an SGD-with-momentum update;
    returns the loss and the updated parameters and momenta."""
    vocab, seq, dim, hidden = 24, 8, 16, 32

    def loss_fn(params, tokens, targets):
        emb, wq, wk, wv, wo, w1, w2, gamma = params
        x = emb[tokens]
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = (q @ k.T) / jnp.sqrt(jnp.float32(dim))
        causal = jnp.tril(jnp.ones((seq, seq), dtype=bool))
        probs = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        x = x + (probs @ v) @ wo
        mean = x.mean(-1, keepdims=True)
        x = (x - mean) * lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * gamma
        x = x + jax.nn.gelu(x @ w1, approximate=False) @ w2
        logits = x @ emb.T
        picked = jnp.take_along_axis(logits, targets[:, None], axis=-1)[:, 0]
        return jnp.mean(jax.nn.logsumexp(logits, axis=-1) - picked)

    def f(params, momenta, tokens, targets):
        loss, grads = jax.value_and_grad(loss_fn)(params, tokens, targets)
        momenta = [0.9 * m + g for m, g in zip(momenta, grads)]
        params = [p - 0.05 * m for p, m in zip(params, momenta)]
        return loss, params, momenta

    params = [normal(rng, (vocab, dim)), weight(rng, dim, dim), weight(rng, dim, dim), weight(rng, dim, dim),
              weight(rng, dim, dim), weight(rng, dim, hidden), weight(rng, hidden, dim),
              np.ones((dim,), np.float32)]
    momenta = [np.zeros_like(p) for p in params]
    tokens = rng.integers(0, vocab, size=(seq,)).astype(np.int32)
    targets = np.roll(tokens, -1)
    return f, [params, momenta, tokens, targets]


def case_sorting(rng):
    """jnp.sort along each axis (NaN, infinities, signed zeros, ties), a descending
    sort, argsort (stable: ties keep their order), lax.sort by key with a payload, an
    integer sort with two keys, and jax.random.permutation (a sort by random keys)."""
    def f(x, n, payload, key_data):
        key = jax.random.wrap_key_data(key_data)
        by_key = lax.sort((x[0], payload), num_keys=1)
        two_keys = lax.sort((n[:, 0], n[:, 1], payload[: n.shape[0]]), num_keys=2)
        return (jnp.sort(x, axis=1), jnp.sort(x, axis=0), -jnp.sort(-x, axis=1), jnp.argsort(x, axis=1),
                jnp.argsort(n[:, 0]), by_key[0], by_key[1], two_keys[0], two_keys[1], two_keys[2],
                jax.random.permutation(key, 20))

    x = np.round(normal(rng, (5, 12), 3.0))
    x[0, :5] = [np.nan, np.inf, -np.inf, -0.0, 0.0]
    x[2, :2] = [np.nan, -np.nan]
    n = rng.integers(-3, 3, size=(9, 2)).astype(np.int32)
    payload = np.arange(12, dtype=np.float32) * 10
    return f, [x, n, payload, np.asarray(jax.random.key_data(jax.random.key(7)))]


def case_cnn_train_step(rng):
    """A small CNN (NHWC): two 3x3 convolutions (one strided), ReLU, max pooling,
    global average pooling and a dense head, with a cross-entropy loss; returns the
    loss, the logits and the gradients of every weight (which are convolutions too:
    lhs- and rhs-dilated, with the batch as the contracted dimension)."""
    def loss_fn(params, x, labels):
        w1, w2, wd = params
        dn = ("NHWC", "HWIO", "NHWC")
        h = jax.nn.relu(lax.conv_general_dilated(x, w1, (1, 1), "SAME", dimension_numbers=dn))
        h = lax.reduce_window(h, -jnp.inf, lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
        h = jax.nn.relu(lax.conv_general_dilated(h, w2, (2, 2), "SAME", dimension_numbers=dn))
        logits = h.mean(axis=(1, 2)) @ wd
        loss = jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, labels[:, None], -1)[:, 0])
        return loss, logits

    def f(params, x, labels):
        (loss, logits), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, labels)
        return loss, logits, grads

    params = [normal(rng, (3, 3, 3, 8), 0.3), normal(rng, (3, 3, 8, 16), 0.15), normal(rng, (16, 5), 0.3)]
    return f, [params, normal(rng, (4, 12, 12, 3)), rng.integers(0, 5, size=(4,)).astype(np.int32)]


def case_convolutions(rng):
    """Convolutions of every layout and option: NCHW/OIHW, 1-D and 3-D, padding,
    strides, lhs and rhs dilation, feature groups (depthwise), and the batch-grouped
    convolution that the gradient of a grouped convolution's kernel is."""
    def f(x2, w2, x1, w1, x3, w3, xd, wd):
        nchw = lax.conv_general_dilated(x2, w2, (2, 1), [(1, 2), (0, 1)], lhs_dilation=(1, 2), rhs_dilation=(2, 1),
                                        dimension_numbers=("NCHW", "OIHW", "NCHW"))
        one_d = lax.conv_general_dilated(x1, w1, (1,), "SAME", dimension_numbers=("NWC", "WIO", "NWC"))
        three_d = lax.conv_general_dilated(x3, w3, (1, 1, 1), "VALID", dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))
        depthwise = lax.conv_general_dilated(xd, wd, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                             feature_group_count=4)
        kernel_grad = jax.grad(lambda w: lax.conv_general_dilated(
            xd, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"), feature_group_count=4).sum())(wd)
        return nchw, one_d, three_d, depthwise, kernel_grad

    return f, [normal(rng, (2, 3, 7, 6)), normal(rng, (4, 3, 3, 2)), normal(rng, (2, 9, 3)), normal(rng, (3, 3, 5)),
               normal(rng, (1, 4, 5, 4, 2)), normal(rng, (2, 2, 2, 2, 3)), normal(rng, (2, 6, 6, 4)),
               normal(rng, (3, 3, 1, 8))]


def case_remat(rng):
    """The gradient of a two-layer block under jax.checkpoint (rematerialisation),
    which puts opt-barrier around the recomputed values."""
    def f(x, w):
        block = jax.checkpoint(lambda h: jnp.tanh(h @ w))
        return jax.value_and_grad(lambda x, w: (block(block(x)) ** 2).sum(), argnums=(0, 1))(x, w)

    return f, [normal(rng, (6, 8)), weight(rng, 8, 8)]


CASES = [
    ("mlp", case_mlp, 1001),
    ("attention", case_attention, 1002),
    ("gelu_ffn", case_gelu_ffn, 1003),
    ("rmsnorm", case_rmsnorm, 1004),
    ("softmax_rows", case_softmax_rows, 1005),
    ("batched_matmul", case_batched_matmul, 1006),
    ("int_ops", case_int_ops, 1007),
    ("slice_concat", case_slice_concat, 1008),
    ("reduce_variants", case_reduce_variants, 1009),
    ("nested_call", case_nested_call, 1010),
    ("special_constants", case_special_constants, 1011),
    ("float_math", case_float_math, 1012),
    ("integer_bits", case_integer_bits, 1013),
    ("pred_logic", case_pred_logic, 1014),
    ("narrow_ints", case_narrow_ints, 1015),
    ("wide_ints", case_wide_ints, 1016),
    ("half_floats", case_half_floats, 1017),
    ("bf16_matmul", case_bf16_matmul, 1018),
    ("convert_matrix", case_convert_matrix, 1019),
    ("layer_norm", case_layer_norm, 1020),
    ("rotary_embedding", case_rotary_embedding, 1021),
    ("embedding_gather", case_embedding_gather, 1022),
    ("scatter_updates", case_scatter_updates, 1023),
    ("mlp_grad", case_mlp_grad, 1024),
    ("pad_reverse", case_pad_reverse, 1025),
    ("dynamic_slices", case_dynamic_slices, 1026),
    ("batch_norm", case_batch_norm, 1027),
    ("random_numbers", case_random_numbers, 1028),
    ("clamp_bitcast", case_clamp_bitcast, 1029),
    ("batched_gather_scatter", case_batched_gather_scatter, 1030),
    ("single_core_collectives", case_single_core_collectives, 1031),
    ("argmax", case_argmax, 1032),
    ("max_pool_grad", case_max_pool_grad, 1033),
    ("batch_norm_ops", case_batch_norm_ops, 1034),
    ("rng_bit_generator", case_rng_bit_generator, 1035),
    ("jax_random", case_jax_random, 1036),
    ("fori_loop", case_fori_loop, 1037),
    ("while_tolerance", case_while_tolerance, 1038),
    ("scan_rnn", case_scan_rnn, 1039),
    ("cond_switch", case_cond_switch, 1040),
    ("jax_random_default", case_jax_random_default, 1041),
    ("more_elementwise", case_more_elementwise, 1042),
    ("top_k", case_top_k, 1043),
    ("windows", case_windows, 1044),
    ("transformer_train_step", case_transformer_train_step, 1045),
    ("sorting", case_sorting, 1046),
    ("cnn_train_step", case_cnn_train_step, 1047),
    ("convolutions", case_convolutions, 1048),
    ("remat", case_remat, 1049),
]

# Cases generated with 64-bit types enabled (jax_enable_x64), for s64 / u64.
X64_CASES = {"wide_ints", "rng_bit_generator"}

# Extra sanity checks on the computed outputs of some cases.
OUTPUT_CHECKS = {"special_constants": check_special_constants}


# ---------------------------------------------------------------------------
# HLO inspection
# ---------------------------------------------------------------------------

# Computation header, e.g. "region_0.1 {" or "ENTRY main.3 {".
_COMP_RE = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
# Instruction line, e.g. "  ROOT add.3 = f32[4]{0} add(a.1, b.2)".
_INSTR_RE = re.compile(r"^\s+(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(.*)$")


def instructions(hlo):
    """Yield (computation_name, opcode, full_line) for every HLO instruction."""
    comp = None
    for line in hlo.splitlines():
        if line.startswith("HloModule"):
            continue
        m = _COMP_RE.match(line)
        if m:
            comp = m.group(1)
            continue
        m = _INSTR_RE.match(line)
        if not m:
            continue
        rest = m.group(1)
        # Skip the result type: either a tuple type "( ... )" or one token.
        if rest.startswith("("):
            depth = 0
            for idx, ch in enumerate(rest):
                depth += ch == "("
                depth -= ch == ")"
                if depth == 0:
                    rest = rest[idx + 1:]
                    break
        else:
            rest = rest.split(None, 1)[1]
        opcode = rest.strip().split("(", 1)[0]
        yield comp, opcode, line


def check_hlo(name, hlo):
    """Return the opcode set; raise if anything outside the allowed subset."""
    ops = set()
    reduce_regions = set(re.findall(r"reduce\(.*to_apply=([\w.\-]+)", hlo))
    for comp, op, line in instructions(hlo):
        ops.add(op)
        if op not in ALLOWED_OPCODES:
            raise SystemExit(f"[{name}] disallowed opcode {op!r}: {line.strip()}")
        if comp in reduce_regions and op not in ("parameter",) \
                and op not in ALLOWED_REDUCE_OPS:
            raise SystemExit(f"[{name}] disallowed reduce region op {op!r}")
    dtypes = set(re.findall(r"\b([a-z]+[0-9]*)\[", hlo))
    bad = dtypes - ALLOWED_DTYPES
    if bad:
        raise SystemExit(f"[{name}] disallowed element types {sorted(bad)}")
    return ops


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------

def describe(arr):
    return f"{arr.dtype}{list(arr.shape)}"


def save_npy(path, arr):
    # (np.ascontiguousarray would turn 0-d scalars into shape (1,); avoid it.)
    arr = np.asarray(arr, order="C")
    if arr.nbytes > MAX_TENSOR_BYTES:
        raise SystemExit(f"{path}: {arr.nbytes} bytes exceeds {MAX_TENSOR_BYTES}")
    np.save(path, arr, allow_pickle=False)


def generate(name, builder, seed):
    if name in X64_CASES:
        with jax.enable_x64(True):
            return generate_case(name, builder, seed)
    return generate_case(name, builder, seed)


def generate_case(name, builder, seed):
    rng = np.random.default_rng(seed)
    fn, args = builder(rng)
    jitted = jax.jit(fn)
    hlo = jitted.lower(*args).as_text(dialect="hlo")
    ops = check_hlo(name, hlo)

    # Nested results (a tuple inside a tuple) flatten in order, as the HLO's outputs do.
    outs = [np.asarray(o) for o in jax.tree_util.tree_leaves(jitted(*args))]
    if name in OUTPUT_CHECKS:
        OUTPUT_CHECKS[name](outs)

    case_dir = OUT_DIR / name
    if case_dir.exists():
        shutil.rmtree(case_dir)  # drop stale files from earlier versions
    case_dir.mkdir(parents=True)
    (case_dir / "model.hlo").write_text(hlo)
    # Pytree arguments (a list of parameters) flatten in order, as the HLO's parameters do.
    for i, a in enumerate(jax.tree_util.tree_leaves(args)):
        save_npy(case_dir / f"input{i}.npy", np.asarray(a))
    for i, o in enumerate(outs):
        save_npy(case_dir / f"output{i}.npy", o)

    return {
        "case": name,
        "inputs": ", ".join(describe(np.asarray(a)) for a in jax.tree_util.tree_leaves(args)),
        "outputs": ", ".join(describe(o) for o in outs),
        "ops": " ".join(sorted(ops)),
    }


def main():
    print(f"jax {jax.__version__}, jaxlib {jax.lib.__version__}, "
          f"numpy {np.__version__}, backend {jax.default_backend()}")
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[1:])  # optional case names: regenerate just those
    unknown = only - {name for name, _, _ in CASES}
    if unknown:
        raise SystemExit(f"unknown case(s): {sorted(unknown)}")
    rows = [generate(name, builder, seed) for name, builder, seed in CASES if not only or name in only]
    for r in rows:
        print(f"\n{r['case']}\n  inputs : {r['inputs']}\n  outputs: {r['outputs']}"
              f"\n  opcodes: {r['ops']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
