"""The driver structures PDL launches pass (cuda.h layouts) and the argument packing; the launch
itself runs on a GPU only (tests/test_cuda_w4a16.py, marked cuda)."""

import ctypes

import pytest
import torch

from fp4lab.backends import cuda_launch


def test_structures_have_cuda_h_sizes_and_offsets():
    # sizeof/offsetof read from CUDA 13's cuda.h with gcc on x86_64
    assert ctypes.sizeof(cuda_launch.LaunchAttributeValue) == 64
    assert ctypes.sizeof(cuda_launch.LaunchAttribute) == 72
    assert cuda_launch.LaunchAttribute.value.offset == 8
    assert ctypes.sizeof(cuda_launch.LaunchConfig) == 56
    assert cuda_launch.LaunchConfig.stream.offset == 32
    assert cuda_launch.LaunchConfig.num_attrs.offset == 48


def test_the_attribute_allows_programmatic_serialization():
    attribute = cuda_launch.dependent_launch_attribute()
    assert attribute.id == 6 and attribute.value.programmatic_stream_serialization_allowed == 1
    attributes = cuda_launch.launch_attributes(True, (1, 1, 1))
    config = cuda_launch.launch_config((128, 8, 1), (128, 1, 1), 4096, 0xABC0, attributes)
    assert (config.grid_x, config.grid_y, config.block_x, config.shared_bytes) == (128, 8, 128, 4096)
    assert config.stream == 0xABC0 and config.num_attrs == 1 and config.attrs.contents.id == 6


def test_a_cluster_launch_carries_both_attributes_in_cuda_h_layout():
    # the cluster dimension's x, y, z are the value union's first 12 bytes (CUlaunchAttributeValue)
    assert cuda_launch.LaunchAttributeValue.cluster.offset == 0
    attributes = cuda_launch.launch_attributes(True, (1, 8, 1))
    config = cuda_launch.launch_config((32, 8, 1), (512, 1, 1), 0, 0, attributes)
    assert config.num_attrs == 2
    assert [config.attrs[i].id for i in range(2)] == [6, 4]
    cluster = config.attrs[1].value.cluster
    assert (cluster.x, cluster.y, cluster.z) == (1, 8, 1)
    assert cuda_launch.launch_attributes(False, (1, 1, 1))._length_ == 0
    only_cluster = cuda_launch.launch_attributes(False, (1, 4, 1))
    assert [a.id for a in only_cluster] == [4]


def test_parameters_point_at_each_value_and_refuse_other_types():
    tensor = torch.zeros(4)
    pointers, values = cuda_launch.kernel_parameters([tensor, 7, -1])
    assert len(pointers) == 3
    assert ctypes.cast(pointers[0], ctypes.POINTER(ctypes.c_void_p)).contents.value == tensor.data_ptr()
    assert ctypes.cast(pointers[1], ctypes.POINTER(ctypes.c_int)).contents.value == 7
    assert ctypes.cast(pointers[2], ctypes.POINTER(ctypes.c_int)).contents.value == -1
    assert len(values) == 3
    for bad in (1.5, True, "8"):
        with pytest.raises(TypeError, match="only tensors and ints"):
            cuda_launch.kernel_parameters([bad])
