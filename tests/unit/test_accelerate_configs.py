"""The accelerate configs in configs/accelerate/: the GPU ones cannot run here, so accelerate must at least
read each as what it claims to be. (The CPU ones run for real: tests/e2e/test_launchers.py.)"""

from __future__ import annotations

from conftest import REPO

CONFIGS = REPO / "configs" / "accelerate"


def test_accelerate_configs_load_as_intended() -> None:
    from accelerate.commands.config.config_args import load_config_from_file

    expect = {  # distributed type, processes, machines
        "cpu.yaml": ("NO", 1, 1),
        "cpu_multi.yaml": ("MULTI_GPU", 2, 1),
        "single_gpu.yaml": ("NO", 1, 1),
        "multi_gpu.yaml": ("MULTI_GPU", 4, 1),
        "multi_node.yaml": ("MULTI_GPU", 8, 2),
        "fsdp.yaml": ("FSDP", 4, 1),
    }
    assert sorted(p.name for p in CONFIGS.glob("*.yaml")) == sorted(expect)
    for name, want in expect.items():
        cfg = load_config_from_file(str(CONFIGS / name))
        assert (cfg.distributed_type.value, cfg.num_processes, cfg.num_machines) == want, name
    fsdp = load_config_from_file(str(CONFIGS / "fsdp.yaml")).fsdp_config
    assert fsdp["fsdp_transformer_layer_cls_to_wrap"] == "BertLayer"


def test_multi_node_command_as_documented_rendezvous_c10d_on_the_first_node() -> None:
    """What torchrun gets from multi_node.yaml's documented command (accelerate ignores rdzv keys in a
    config): c10d at the first node's address on every node, 4 workers per node of 2."""
    # _filter_args and _validate_launch_command are private: listed in qa_hpc/private_api.py
    import torch.distributed.run as distrib_run
    from accelerate.commands.launch import _filter_args, _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    argv = [
        "--config_file",
        str(CONFIGS / "multi_node.yaml"),
        "--rdzv_backend",
        "c10d",
        "--machine_rank",
        "1",
        "--main_process_port",
        "15123",
        "--main_process_ip",
        "gpu-node7",
        "run_qa.py",
    ]
    args, _, _ = _validate_launch_command(launch_command_parser().parse_args(argv))
    prepare_multi_gpu_env(args)
    torchrun_args = _filter_args(
        args,
        distrib_run.get_args_parser(),
        ["--training_script", args.training_script, "--training_script_args", []],
    )
    launch, _, _ = distrib_run.config_from_args(torchrun_args)
    assert (launch.rdzv_backend, launch.rdzv_endpoint) == ("c10d", "gpu-node7:15123")
    assert (launch.min_nodes, launch.max_nodes, launch.nproc_per_node) == (2, 2, 4)
