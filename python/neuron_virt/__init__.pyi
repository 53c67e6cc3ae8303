"""Types of the public API of neuron_virt."""

from os import PathLike
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union, overload

import numpy as np

from ._native import CompileError as CompileError
from ._native import Neff as Neff
from ._native import NrtError as NrtError
from ._native import __version__ as __version__
from ._native import compile as compile


class TensorInfo(Tuple[str, str, str, Tuple[int, ...]]):
    name: str
    hlo_name: str
    dtype: str
    shape: Tuple[int, ...]

class Request:
    seq: int
    def done(self) -> bool: ...
    def result(self, timeout: Optional[float] = None) -> Union[np.ndarray, Tuple[np.ndarray, ...]]: ...

class Model:
    inputs: List[TensorInfo]
    outputs: List[TensorInfo]
    name: str
    core: int
    id: int
    def __call__(self, *arrays: Any) -> Union[np.ndarray, Tuple[np.ndarray, ...]]: ...
    def run(self, arrays: Sequence[Any]) -> List[np.ndarray]: ...
    def schedule(self, *arrays: Any) -> Request: ...
    def unload(self) -> None: ...

class Runtime:
    cores: List[int]
    instance_type: str
    datastore_path: str
    def __init__(
        self,
        *,
        cores: Union[None, int, str, Sequence[int]] = None,
        instance_type: Optional[str] = None,
        tag: Optional[str] = None,
    ) -> None: ...
    def load(self, neff: Neff, *, core: Optional[int] = None) -> Model: ...
    def load_collectives(self, neff: Neff, cores: Sequence[int]) -> List[Model]: ...
    def load_collectives_across(self, neff: Neff, core: int, rank: int, count: int) -> Model: ...
    def close(self) -> None: ...
    def __enter__(self) -> Runtime: ...
    def __exit__(self, *exc: Any) -> None: ...

def runtime(
    *,
    cores: Union[None, int, str, Sequence[int]] = None,
    instance_type: Optional[str] = None,
    tag: Optional[str] = None,
) -> Runtime: ...

class JitFunction:
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
    def lower(self, *args: Any, **kwargs: Any) -> str: ...

@overload
def jit(fn: Callable[..., Any], *, cores: Union[None, int, Sequence[int]] = None,
        ranks: Optional[Sequence[int]] = None, runtime: Optional[Runtime] = None,
        auto_cast: str = "matmult", auto_cast_type: str = "bf16", optlevel: int = 2,
        mixed_precision_accumulation: bool = False, saturate_infinity: bool = False,
        target: Optional[str] = None) -> JitFunction: ...
@overload
def jit(fn: None = None, *, cores: Union[None, int, Sequence[int]] = None,
        ranks: Optional[Sequence[int]] = None, runtime: Optional[Runtime] = None,
        auto_cast: str = "matmult", auto_cast_type: str = "bf16", optlevel: int = 2,
        mixed_precision_accumulation: bool = False, saturate_infinity: bool = False,
        target: Optional[str] = None) -> Callable[[Callable[..., Any]], JitFunction]: ...

class ProcessShards:
    shape: Tuple[int, ...]
    dtype: np.dtype
    shards: Dict[int, Tuple[Tuple[slice, ...], np.ndarray]]

def make_mesh(axis_shapes: Sequence[int], axis_names: Sequence[str]) -> Any: ...

class profile:
    path: str
    device_trace: str
    nth: int
    summary: Optional[Dict[str, int]]
    def __init__(self, path: Union[str, PathLike], *, device_trace: str = "all", nth: int = 1,
                 runtime: Optional[Runtime] = None) -> None: ...
    def __enter__(self) -> profile: ...
    def __exit__(self, *exc: Any) -> bool: ...

def sys_trace_start(*, cores: Optional[Sequence[int]] = None, event_types: Optional[Sequence[str]] = None,
                    max_events_per_nc: Optional[int] = None, runtime: Optional[Runtime] = None) -> None: ...
def sys_trace_stop(*, runtime: Optional[Runtime] = None) -> None: ...
def sys_trace_fetch_events(*, core: Optional[int] = None, max_events_per_nc: Optional[int] = None,
                           runtime: Optional[Runtime] = None) -> List[Dict[str, Any]]: ...
