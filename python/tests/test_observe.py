"""Profiles from Python (NTFF files neuron-profile reads), the system trace as dicts,
and scheduled requests."""

import json
import os
import subprocess

import numpy as np
import pytest

import neuron_virt

MATMUL = """HloModule matmul

ENTRY main {
  x = f32[256,256]{1,0} parameter(0)
  ROOT y = f32[256,256]{1,0} dot(x, x), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}
"""


@pytest.fixture(scope="module")
def matmul(rt):
    model = rt.load(neuron_virt.compile(MATMUL, name="matmul", auto_cast="none"))
    yield model
    model.unload()


def summary_of(path):
    """What `neuron-profile view` says of the file (the test harness gives the binary)."""
    binary = os.environ.get("NEURON_PROFILE")
    if not binary:
        pytest.skip("NEURON_PROFILE (the neuron-profile binary) is not set")
    out = subprocess.run([binary, "view", "--output-format", "summary-json", "-s", str(path)],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)


@pytest.mark.parametrize("device_trace, traced", [("all", 3), ("nth", 1), ("none", 0)])
def test_profiles_record_the_block(rt, matmul, tmp_path, device_trace, traced):
    x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
    path = tmp_path / f"{device_trace}.ntff"
    with neuron_virt.profile(path, device_trace=device_trace, nth=2) as p:
        for _ in range(3):
            matmul(x)
    assert p.summary["system_events"] > 0 and p.summary["lost_events"] == 0
    assert (p.summary["device_events"] > 0) == (traced > 0)
    summary = summary_of(path)
    assert summary["process"]["capture_kind"] == "python"
    # Named as the live tools name the process: the module run with -m, not "python".
    assert summary["process"]["program"] == "pytest"
    assert summary["executions"]["count"] == 3
    assert summary["executions"]["device_traced"] == traced
    assert "matmul" in [m["name"] for m in summary["models"]]


def test_one_profile_at_a_time(rt, tmp_path):
    with neuron_virt.profile(tmp_path / "a.ntff"):
        with pytest.raises(RuntimeError, match="already being recorded"):
            with neuron_virt.profile(tmp_path / "b.ntff"):
                pass
    with pytest.raises(ValueError):
        neuron_virt.profile(tmp_path / "c.ntff", device_trace="some")


def test_sys_trace_events_come_once_as_dicts(rt, matmul):
    x = np.ones((256, 256), np.float32)
    neuron_virt.sys_trace_start(event_types=["nrt_execute"])
    try:
        matmul(x)
        matmul(x)
        first = neuron_virt.sys_trace_fetch_events(core=matmul.core, max_events_per_nc=3)
        rest = neuron_virt.sys_trace_fetch_events()
        again = neuron_virt.sys_trace_fetch_events()
    finally:
        neuron_virt.sys_trace_stop()
    assert [e["event_type"] for e in first + rest] == ["nrt_execute"] * 4
    assert len(first) == 3 and again == []
    assert [e["phase"] for e in first + rest] == ["start", "stop", "start", "stop"]
    assert list(first[0])[:8] == ["event_type", "phase", "id", "nc_idx", "tracking_id", "thread_id", "data",
                                  "timestamp_ns"]
    assert all(e["nc_idx"] == matmul.core for e in first)


def test_scheduled_requests_give_what_calls_give(rt, matmul):
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(6)]
    requests = [matmul.schedule(x) for x in xs]
    results = [r.result(timeout=60) for r in requests]
    for x, y in zip(xs, results):
        np.testing.assert_array_equal(y, matmul(x))
    assert all(r.done() for r in requests)
    assert requests[1].seq == requests[0].seq + 1


def test_a_full_queue_says_so_and_a_dropped_request_is_harmless(rt, matmul):
    x = np.ones((256, 256), np.float32)
    requests, full = [], None
    for _ in range(64):
        try:
            requests.append(matmul.schedule(x))
        except neuron_virt.NrtError as error:
            full = error
            break
    assert full is not None and full.status == "NRT_QUEUE_FULL" and full.code == 7
    del requests[0]  # its arrays stay alive until it completes
    for request in requests:
        np.testing.assert_array_equal(request.result(timeout=60), np.full((256, 256), 256, np.float32))


def test_a_failed_request_raises_its_status(rt):
    model = rt.load(neuron_virt.compile(MATMUL, name="failing", auto_cast="none"))
    request = model.schedule(np.ones((256, 256), np.float32))
    request.result(timeout=60)
    model.unload()
    with pytest.raises(neuron_virt.NrtError) as caught:
        model.schedule(np.ones((256, 256), np.float32))
    assert caught.value.status == "NRT_INVALID_HANDLE"


def test_an_output_written_by_a_request_in_flight_is_not_lent_again(rt, matmul):
    x, out = np.ones((256, 256), np.float32), np.empty((256, 256), np.float32)
    # Seven requests of a matrix product take far longer than scheduling one more.
    requests = [matmul._native.schedule([x], [np.empty((256, 256), np.float32)]) for _ in range(6)]
    requests.append(matmul._native.schedule([x], [out]))
    with pytest.raises(neuron_virt.NrtError, match="still in flight"):
        matmul._native.schedule([out], [np.empty((256, 256), np.float32)])
    for request in requests:
        request.wait()


def test_dropping_models_and_requests_in_flight_is_harmless(rt):
    import gc

    model = rt.load(neuron_virt.compile(MATMUL, name="dropped", auto_cast="none"))
    requests = [model.schedule(np.ones((256, 256), np.float32)) for _ in range(4)]
    del model, requests
    gc.collect()
    # Whatever the dropped requests still write lives on until they complete; the
    # runtime runs on.
    survivor = rt.load(neuron_virt.compile(MATMUL, name="survivor", auto_cast="none"))
    np.testing.assert_array_equal(survivor(np.ones((256, 256), np.float32)), np.full((256, 256), 256, np.float32))
    survivor.unload()


FAILING_CHILD = """
import numpy as np, neuron_virt
hlo = "HloModule add\\n\\nENTRY main {\\n  x = f32[4]{0} parameter(0)\\n  ROOT y = f32[4]{0} add(x, x)\\n}\\n"
rt = neuron_virt.Runtime(cores=[0])
model = rt.load(neuron_virt.compile(hlo, name="add"))
first, second = model.schedule(np.ones(4, np.float32)), model.schedule(np.ones(4, np.float32))
print(first.result(timeout=60).tolist())
for _ in range(2):
    try:
        second.result(timeout=60)
        print("no error")
    except neuron_virt.NrtError as error:
        print(error.status, error.code)
"""


def test_a_request_that_fails_while_running_raises_its_status_each_time(tmp_path):
    import sys

    env = dict(os.environ, NEURON_RT_FAULT_INJECT="oob:every=2", NEURON_VIRT_LOCK_DIR=str(tmp_path),
               NEURON_VIRT_DATASTORE_DIR=str(tmp_path / "datastores"))
    out = subprocess.run([sys.executable, "-c", FAILING_CHILD], env=env, capture_output=True, text=True,
                         timeout=120).stdout
    assert out.splitlines() == ["[2.0, 2.0, 2.0, 2.0]", "NRT_EXEC_OOB 1006", "NRT_EXEC_OOB 1006"], out
