"""tracelab.ingest.columns: the derived columns of a converted trace, on small hand-built inputs."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from tracelab.ingest import columns


@pytest.mark.parametrize("bound", [7, 50_000, 10**12])  # table lookup, and np.unique past 1M
def test_unique_small_is_np_unique(bound: int) -> None:
    rng = np.random.default_rng(3)
    key = rng.integers(0, bound, size=5_000, dtype=np.int64)
    uniq, inverse = columns._unique_small(key, bound)
    want_uniq, want_inverse = np.unique(key, return_inverse=True)
    np.testing.assert_array_equal(uniq, want_uniq)
    np.testing.assert_array_equal(inverse, want_inverse.reshape(-1))
    np.testing.assert_array_equal(uniq[inverse], key)


def test_classify_columns_per_event() -> None:
    cats = pa.array(["kernel", "cpu_op", None, "kernel", "cuda_runtime"])
    names = pa.array(
        [
            "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
            "aten::mm",
            "x",
            "ampere_sgemm_128x64_tn",
            "cudaLaunchKernel",
        ]
    )
    category, on_device = columns.classify_columns(cats, names)
    assert on_device.to_pylist() == [True, False, False, True, False]
    assert category.to_pylist()[0] == "communication"
    assert category.to_pylist()[1] == "cpu_op"
    assert category.to_pylist()[3] == "compute"
    assert category.to_pylist()[4] == "runtime"
