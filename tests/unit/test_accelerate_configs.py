"""The accelerate configs in configs/accelerate/: the GPU ones cannot run here, so accelerate must at least read
each as what it claims to be. (The CPU ones run for real: tests/e2e/test_launchers.py.)"""

from __future__ import annotations

from conftest import REPO


def test_accelerate_configs_load_as_intended() -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    expect = {
        "cpu.yaml": ("NO", 1), "cpu_multi.yaml": ("MULTI_GPU", 2), "single_gpu.yaml": ("NO", 1),
        "multi_gpu.yaml": ("MULTI_GPU", 4), "multi_node.yaml": ("MULTI_GPU", 8), "fsdp.yaml": ("FSDP", 4),
    }
    found = sorted(p.name for p in (REPO / "configs" / "accelerate").glob("*.yaml"))
    assert found == sorted(expect)
    for name, (kind, procs) in expect.items():
        cfg = load_config_from_file(str(REPO / "configs" / "accelerate" / name))
        assert cfg.distributed_type.value == kind and cfg.num_processes == procs, name
    assert load_config_from_file(str(REPO / "configs" / "accelerate" / "multi_node.yaml")).num_machines == 2
    fsdp = load_config_from_file(str(REPO / "configs" / "accelerate" / "fsdp.yaml")).fsdp_config
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"
