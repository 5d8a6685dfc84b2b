"""--attn_backend applied to torch's SDPA switches and read back: auto on a CPU changes nothing, a list
enables exactly its kernels, and a CPU's SDPA really runs only on the kernels left on (why the plan refuses
a CPU list without flash or math)."""

from __future__ import annotations

import pytest
import torch

from qa_hpc import attention
from qa_hpc.device import read_device_facts
from qa_hpc.flags import read_flags
from qa_hpc.plan import decide


@pytest.fixture(autouse=True)
def torch_default_kernels():
    """Every test starts and ends with torch's own state: every kernel enabled."""
    attention.apply(attention.ALL)
    yield
    attention.apply(attention.ALL)


def switches() -> dict[str, bool]:
    return {name: is_enabled() for name, (_, is_enabled) in attention.SWITCHES.items()}


def test_auto_on_a_cpu_changes_nothing():
    before = switches()
    plan = decide(read_flags(["--use_cpu"]), read_device_facts())
    attention.apply(plan.attn_backend)
    assert plan.attn_backend == "all" and switches() == before == dict.fromkeys(attention.SWITCHES, True)
    assert attention.enabled("sdpa") == "all"


@pytest.mark.parametrize(
    "asked, want",
    [("math,flash", "flash,math"), ("cudnn", "cudnn"), ("flash,efficient,math", "flash,efficient,math")],
)
def test_a_list_enables_exactly_its_kernels_and_reads_back(asked, want):
    attention.apply(asked)
    assert switches() == {name: name in want.split(",") for name in attention.SWITCHES}
    assert attention.enabled("sdpa") == attention.enabled("sdpa_bulk_dropout") == want
    assert attention.enabled("eager") == attention.enabled("flash_attention_2") == "n/a"


def test_a_cpu_runs_sdpa_only_on_the_kernels_left_on():
    q = torch.randn(2, 2, 8, 16)
    expected = torch.nn.functional.scaled_dot_product_attention(q, q, q)
    for kernels in ("math", "flash"):
        attention.apply(kernels)
        torch.testing.assert_close(torch.nn.functional.scaled_dot_product_attention(q, q, q), expected)
    attention.apply("efficient,cudnn")  # GPU kernels only
    with pytest.raises(RuntimeError, match="No viable backend"):
        torch.nn.functional.scaled_dot_product_attention(q, q, q)
