"""One runtime for the whole session, on every core of a trn1.2xlarge, tagged so that
a test can find this process in the tools."""

import os
import pathlib

import pytest

import neuron_virt

FIXTURES = pathlib.Path(__file__).resolve().parents[2] / "tests" / "data" / "jax"


@pytest.fixture(scope="session")
def rt():
    runtime = neuron_virt.runtime(instance_type="trn1.2xlarge", tag=f"pytest-{os.getpid()}")
    yield runtime


@pytest.fixture(scope="session")
def fixtures():
    return FIXTURES
