"""Launching an NVRTC-built kernel with programmatic dependent launch (PDL), through the driver.

`torch.cuda._compile_kernel` launches with `cuLaunchKernel`, which takes no launch attributes. PDL
needs `cuLaunchKernelEx` with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION: the kernel may
then start while the previous kernel in the stream is still finishing, as soon as every CTA of that
kernel has executed `griddepcontrol.launch_dependents` (or exited); its own `griddepcontrol.wait`
returns once the previous kernel has completed and its writes are visible. Captured into a CUDA
graph, the launch becomes a programmatic edge (CUDA >= 12.3).

The structures mirror cuda.h (CUDA 12-13, 64-bit): CUlaunchAttribute is 72 bytes (a 4-byte id,
4 of padding, a 64-byte value union), CUlaunchConfig 56. tests/test_cuda_launch.py checks the
sizes and offsets.
"""

from __future__ import annotations

import ctypes
import functools

import torch

PROGRAMMATIC_STREAM_SERIALIZATION = 6     # CUlaunchAttributeID, cuda.h
# CUfunction_attribute, cuda.h: what ptxas gave the build
FUNCTION_ATTRIBUTES = {"local_bytes": 3, "registers": 4}


class LaunchAttributeValue(ctypes.Union):
    _fields_ = [("programmatic_stream_serialization_allowed", ctypes.c_int),
                ("pad", ctypes.c_char * 64)]


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
                  attribute: LaunchAttribute) -> LaunchConfig:
    """A CUlaunchConfig with one attribute (the caller keeps `attribute` alive)."""
    return LaunchConfig(*grid, *block, shared_bytes, ctypes.c_void_p(stream),
                        ctypes.pointer(attribute), 1)


def dependent_launch_attribute() -> LaunchAttribute:
    attribute = LaunchAttribute(id=PROGRAMMATIC_STREAM_SERIALIZATION)
    attribute.value.programmatic_stream_serialization_allowed = 1
    return attribute


@functools.lru_cache(maxsize=None)
def _driver() -> ctypes.CDLL:
    driver = ctypes.CDLL("libcuda.so.1")    # the library torch already loaded: same handle
    driver.cuLaunchKernelEx.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                                        ctypes.c_void_p, ctypes.c_void_p]
    driver.cuLaunchKernelEx.restype = ctypes.c_int
    driver.cuFuncGetAttribute.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int,
                                          ctypes.c_void_p]
    driver.cuFuncGetAttribute.restype = ctypes.c_int
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


def launch_dependent(kernel, grid, block, shared_mem: int, args: list) -> None:
    """Launch a `torch.cuda._compile_kernel` kernel on the current stream with PDL allowed."""
    pointers, _values = kernel_parameters(args)
    attribute = dependent_launch_attribute()
    config = launch_config(grid, block, shared_mem, torch.cuda.current_stream().cuda_stream,
                           attribute)
    driver = _driver()
    _check(driver, driver.cuLaunchKernelEx(ctypes.byref(config), kernel.func, pointers, None),
           "cuLaunchKernelEx")
