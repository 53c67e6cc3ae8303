"""Ctrl-C during a long execution raises KeyboardInterrupt promptly, and the runtime
goes on (interrupt_child.py runs the execution)."""

import os
import pathlib
import select
import signal
import subprocess
import sys


def test_ctrl_c_interrupts_a_long_execution_and_the_runtime_goes_on(tmp_path):
    child_program = pathlib.Path(__file__).with_name("interrupt_child.py")
    # Cores of its own, whatever this process holds.
    env = dict(os.environ, NEURON_RT_EXEC_TIMEOUT="3600", NEURON_VIRT_LOCK_DIR=str(tmp_path),
               NEURON_VIRT_DATASTORE_DIR=str(tmp_path / "datastores"), NEURON_VIRT_HOST_THREADS="2")
    child = subprocess.Popen([sys.executable, str(child_program)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        ready, _, _ = select.select([child.stdout], [], [], 60)
        assert ready, "the child did not start its execution"
        assert child.stdout.readline().strip() == "started"
        child.send_signal(signal.SIGINT)
        # The loop runs for minutes; without the interrupt, this would time out.
        out, _ = child.communicate(timeout=60)
    finally:
        child.kill()
    assert out.splitlines() == ["interrupted", "after [2.0, 2.0, 2.0, 2.0]"], out
