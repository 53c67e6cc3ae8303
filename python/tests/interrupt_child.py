"""Run by test_interrupt.py: starts a model that loops for minutes, and reports whether
Ctrl-C (SIGINT) interrupted the wait, then whether another core still runs a model."""

import os
import threading
import time

import numpy as np

import neuron_virt

SPIN = """HloModule spin

cond {
  p = (s32[], f32[64]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  n = s32[] constant(100000000)
  ROOT lt = pred[] compare(i, n), direction=LT
}

body {
  p = (s32[], f32[64]{0}) parameter(0)
  i = s32[] get-tuple-element(p), index=0
  x = f32[64]{0} get-tuple-element(p), index=1
  one = s32[] constant(1)
  j = s32[] add(i, one)
  y = f32[64]{0} sine(x)
  ROOT t = (s32[], f32[64]{0}) tuple(j, y)
}

ENTRY main {
  x = f32[64]{0} parameter(0)
  zero = s32[] constant(0)
  t = (s32[], f32[64]{0}) tuple(zero, x)
  w = (s32[], f32[64]{0}) while(t), condition=cond, body=body
  ROOT r = f32[64]{0} get-tuple-element(w), index=1
}
"""

ADD = """HloModule add

ENTRY main {
  x = f32[4]{0} parameter(0)
  ROOT y = f32[4]{0} add(x, x)
}
"""

rt = neuron_virt.Runtime(cores=[0, 1])
spin = rt.load(neuron_virt.compile(SPIN, name="spin"), core=0)
add = rt.load(neuron_virt.compile(ADD, name="add"), core=1)



def announce():
    # Said from another thread once the execution is well under way, so that the
    # signal the test then sends arrives during it.
    time.sleep(0.5)
    print("started", flush=True)


threading.Thread(target=announce, daemon=True).start()
try:
    spin(np.zeros(64, np.float32))
    print("completed", flush=True)
except KeyboardInterrupt:
    print("interrupted", flush=True)
print("after", add(np.ones(4, np.float32)).tolist(), flush=True)
# nc0 still runs the loop; leave without waiting for it.
os._exit(0)
