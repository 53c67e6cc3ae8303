"""Types of the extension module (the Rust side of neuron_virt)."""

from os import PathLike
from typing import List, Optional, Sequence, Tuple, Union

import numpy as np

__version__: str

IoInfo = Tuple[str, str, str, List[int]]

class NrtError(RuntimeError):
    """A runtime call failed; ``status`` is the NRT_STATUS name, ``code`` its number."""

    status: str
    code: int

class CompileError(ValueError):
    """The compiler refused the HLO; the message names the operator and the line."""

def compile(
    hlo: str,
    *,
    name: str = "model",
    target: str = "trn1",
    auto_cast: str = "matmult",
    auto_cast_type: str = "bf16",
    optlevel: int = 2,
    mixed_precision_accumulation: bool = False,
    saturate_infinity: bool = False,
) -> Neff: ...

class Neff:
    @staticmethod
    def from_bytes(bytes: bytes) -> Neff: ...
    def to_bytes(self) -> bytes: ...
    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> List[IoInfo]: ...
    @property
    def outputs(self) -> List[IoInfo]: ...

class Runtime:
    def __init__(
        self,
        *,
        cores: Union[None, int, str, Sequence[int]] = None,
        instance_type: Optional[str] = None,
        tag: Optional[str] = None,
    ) -> None: ...
    def load(self, neff: Neff, *, core: Optional[int] = None) -> Model: ...
    @property
    def cores(self) -> List[int]: ...
    @property
    def instance_type(self) -> str: ...
    @property
    def datastore_path(self) -> str: ...
    def close(self) -> None: ...

class Model:
    @property
    def name(self) -> str: ...
    @property
    def core(self) -> int: ...
    @property
    def id(self) -> int: ...
    @property
    def inputs(self) -> List[IoInfo]: ...
    @property
    def outputs(self) -> List[IoInfo]: ...
    def execute(self, inputs: List[np.ndarray], outputs: List[np.ndarray]) -> None: ...
    def schedule(self, inputs: List[np.ndarray], outputs: List[np.ndarray]) -> Request: ...
    def unload(self) -> None: ...

class Request:
    def done(self) -> bool: ...
    def wait(self, timeout: Optional[float] = None) -> None: ...
    @property
    def seq(self) -> int: ...

class Profile:
    @staticmethod
    def start(runtime: Runtime, path: Union[str, PathLike], device: bool) -> Profile: ...
    def set_device_trace(self, on: bool) -> None: ...
    def stop(self) -> Tuple[int, int, int]: ...
    @property
    def path(self) -> str: ...

def sys_trace_start(
    runtime: Runtime,
    *,
    cores: Optional[Sequence[int]] = None,
    event_types: Optional[Sequence[str]] = None,
    max_events_per_nc: Optional[int] = None,
) -> None: ...
def sys_trace_stop(runtime: Runtime) -> None: ...
def sys_trace_fetch_events(
    runtime: Runtime, *, core: Optional[int] = None, max_events_per_nc: Optional[int] = None
) -> str: ...
