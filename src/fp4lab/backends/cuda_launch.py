"""Launching an NVRTC-built kernel with launch attributes, through the driver: programmatic
dependent launch (PDL) and thread-block clusters.

`torch.cuda._compile_kernel` launches with `cuLaunchKernel`, which takes no launch attributes. PDL
needs `cuLaunchKernelEx` with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the kernel may
then start while the previous kernel in the stream is still finishing, as soon as every CTA of that
kernel has executed `griddepcontrol.launch_dependents` (or exited); its own `griddepcontrol.wait`
returns once the previous kernel has completed and its writes are visible. Captured into a CUDA
graph, the launch becomes a programmatic edge (CUDA >= 12.3). CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
groups CTAs into clusters (sm_90) that run at once on one GPC and read each other's shared memory;
more than 8 CTAs a cluster needs the function's non-portable-size attribute.

The structures mirror cuda.h (CUDA 12-13, 64-bit): CUlaunchAttribute is 72 bytes (a 4-byte id,
4 of padding, a 64-byte value union), CUlaunchConfig 56. tests/test_cuda_launch.py checks the
sizes and offsets.
"""

from __future__ import annotations

import ctypes
import functools

import torch

CLUSTER_DIMENSION = 4                     # CUlaunchAttributeID, cuda.h
PROGRAMMATIC_STREAM_SERIALIZATION = 6
# CUfunction_attribute, cuda.h: what ptxas gave the build
FUNCTION_ATTRIBUTES = {"local_bytes": 3, "registers": 4}
NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14
MAX_DYNAMIC_SHARED_SIZE_BYTES = 8         # a launch may ask for up to this (default 48 KB)
PORTABLE_CLUSTER = 8                      # CTAs a cluster may have without that attribute


class ClusterDimension(ctypes.Structure):
    _fields_ = [("x", ctypes.c_uint), ("y", ctypes.c_uint), ("z", ctypes.c_uint)]


class LaunchAttributeValue(ctypes.Union):
    _fields_ = [("programmatic_stream_serialization_allowed", ctypes.c_int),
                ("cluster", ClusterDimension), ("pad", ctypes.c_char * 64)]


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


def kernel_parameters(args: list) -> tuple[ctypes.Array, list]:
    """(void*[] of the arguments, the ctypes values it points at, to keep alive): tensors as
    device pointers, Python ints as 32-bit ints, the types the kernels here declare."""
    values = []
    for arg in args:
        if isinstance(arg, torch.Tensor):
            values.append(ctypes.c_void_p(arg.data_ptr()))
        elif isinstance(arg, bool) or not isinstance(arg, int):
            raise TypeError(f"kernel argument {arg!r}: only tensors and ints are passed")
        else:
            values.append(ctypes.c_int(arg))
    pointers = (ctypes.c_void_p * len(values))(
        *(ctypes.cast(ctypes.byref(value), ctypes.c_void_p) for value in values))
    return pointers, values


def launch_config(grid, block, shared_bytes: int, stream: int,
                  attributes: ctypes.Array) -> LaunchConfig:
    """A CUlaunchConfig with an array of attributes (the caller keeps `attributes` alive)."""
    return LaunchConfig(*grid, *block, shared_bytes, ctypes.c_void_p(stream),
                        ctypes.cast(attributes, ctypes.POINTER(LaunchAttribute)), len(attributes))


def dependent_launch_attribute() -> LaunchAttribute:
    attribute = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value.programmatic_stream_serialization_allowed = 1
    return attribute


def cluster_attribute(cluster: tuple[int, int, int]) -> LaunchAttribute:
    """CTAs a cluster along (x, y, z); each must divide the grid's."""
    attribute = LaunchAttribute(id=CLUSTER_DIMENSION)
    attribute.value.cluster = ClusterDimension(*cluster)
    return attribute


def launch_attributes(dependent: bool, cluster: tuple[int, int, int]) -> ctypes.Array:
    """The attributes of one launch: PDL when `dependent`, the cluster shape unless (1, 1, 1)."""
    chosen = ([dependent_launch_attribute()] if dependent else []) + \
        ([cluster_attribute(cluster)] if cluster != (1, 1, 1) else [])
    return (LaunchAttribute * len(chosen))(*chosen)


@functools.lru_cache(maxsize=None)
def _driver() -> ctypes.CDLL:
    driver = ctypes.CDLL("libcuda.so.1")    # the library torch already loaded: same handle
    driver.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p]
    driver.cuLaunchKernelEx.restype = ctypes.c_int
    driver.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                          ctypes.c_void_p]
    driver.cuFuncGetAttribute.restype = ctypes.c_int
    driver.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    driver.cuFuncSetAttribute.restype = ctypes.c_int
    driver.cuOccupancyMaxActiveClusters.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                                    ctypes.POINTER(LaunchConfig)]
    driver.cuOccupancyMaxActiveClusters.restype = ctypes.c_int
    driver.cuOccupancyMaxActiveBlocksPerMultiprocessor.argtypes = [
        ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    driver.cuOccupancyMaxActiveBlocksPerMultiprocessor.restype = ctypes.c_int
    return driver


def _check(driver: ctypes.CDLL, status: int, what: str) -> None:
    if status != 0:
        message = ctypes.c_char_p()
        driver.cuGetErrorString(status, ctypes.byref(message))
        text = message.value.decode() if message.value else "unknown error"
        raise RuntimeError(f"{what} failed: CUDA error {status} ({text})")


def function_attributes(kernel) -> dict[str, int]:
    """Registers a thread and local (spill and stack) bytes a thread of a
    `torch.cuda._compile_kernel` kernel, as the driver reports them for the loaded build."""
    driver, values = _driver(), {}
    for name, attribute in FUNCTION_ATTRIBUTES.items():
        value = ctypes.c_int()
        _check(driver, driver.cuFuncGetAttribute(ctypes.byref(value), attribute, kernel.func),
               "cuFuncGetAttribute")
        values[name] = value.value
    return values


def allow_cluster(kernel, cluster: tuple[int, int, int]) -> None:
    """Let `kernel` launch in clusters of this shape (clusters over PORTABLE_CLUSTER CTAs need the
    function's non-portable attribute; sm_90 runs up to 16)."""
    if cluster[0] * cluster[1] * cluster[2] > PORTABLE_CLUSTER:
        driver = _driver()
        _check(driver, driver.cuFuncSetAttribute(kernel.func, NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
               "cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED)")


_shared_allowed: dict[int, int] = {}       # CUfunction handle -> the ceiling set on it


def allow_shared(kernel, shared_bytes: int) -> None:
    """Let `kernel`'s launches ask for `shared_bytes` of dynamic shared memory (over 48 KB needs
    the opt-in). The attribute is a ceiling shared by every launch of the function, so it only
    ever rises: a launch prepared earlier with more keeps working."""
    handle = int(kernel.func.value if hasattr(kernel.func, "value") else kernel.func)
    if _shared_allowed.get(handle, 0) >= shared_bytes:
        return
    driver = _driver()
    _check(driver, driver.cuFuncSetAttribute(kernel.func, MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes),
           f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES, {shared_bytes})")
    _shared_allowed[handle] = shared_bytes


def resident_ctas(kernel, threads: int, shared_mem: int) -> int:
    """How many CTAs of `threads` threads and `shared_mem` dynamic shared bytes an SM holds at once
    (cuOccupancyMaxActiveBlocksPerMultiprocessor: registers, shared memory and threads)."""
    driver, count = _driver(), ctypes.c_int()
    _check(driver, driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(ctypes.byref(count), kernel.func,
                                                                      threads, shared_mem),
           "cuOccupancyMaxActiveBlocksPerMultiprocessor")
    return count.value


def active_clusters(kernel, grid, block, shared_mem: int, cluster: tuple[int, int, int]) -> int:
    """How many clusters of this shape the GPU runs at once (cuOccupancyMaxActiveClusters): below
    the grid's cluster count, the launch runs in more than one wave."""
    attributes = launch_attributes(False, cluster)
    config = launch_config(grid, block, shared_mem, 0, attributes)
    driver, count = _driver(), ctypes.c_int()
    _check(driver, driver.cuOccupancyMaxActiveClusters(ctypes.byref(count), kernel.func,
                                                       ctypes.byref(config)),
           "cuOccupancyMaxActiveClusters")
    return count.value


def launch_ex(kernel, grid, block, shared_mem: int, args: list, *, dependent: bool = False,
              cluster: tuple[int, int, int] = (1, 1, 1)) -> None:
    """Launch a `torch.cuda._compile_kernel` kernel on the current stream through cuLaunchKernelEx,
    with PDL allowed (`dependent`) and in clusters of `cluster` CTAs (`allow_cluster` first)."""
    pointers, _values = kernel_parameters(args)
    attributes = launch_attributes(dependent, cluster)
    config = launch_config(grid, block, shared_mem, torch.cuda.current_stream().cuda_stream,
                           attributes)
    driver = _driver()
    _check(driver, driver.cuLaunchKernelEx(ctypes.byref(config), kernel.func, pointers, None),
           "cuLaunchKernelEx")
