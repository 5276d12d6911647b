"""Run ids and the torch.distributed.run command line of `traceml run`."""

from __future__ import annotations

from traceml_otel.launch.launcher import LaunchOptions, exit_code_of, resolve_run_id, torchrun_arguments


def test_single_node_uses_standalone_rendezvous() -> None:
    arguments = torchrun_arguments(LaunchOptions("train.py", ("--lr", "1"), nproc_per_node=4))
    assert arguments == ["--nproc-per-node=4", "--standalone", "--local-addr=127.0.0.1",
                         "train.py", "--lr", "1"]


def test_max_restarts_reach_torchrun() -> None:
    arguments = torchrun_arguments(LaunchOptions("train.py", max_restarts=2))
    assert "--max-restarts=2" in arguments and arguments[-1] == "train.py"
    assert not any(a.startswith("--max-restarts") for a in torchrun_arguments(LaunchOptions("train.py")))


def test_multi_node_passes_the_rendezvous_and_agrees_on_a_run_id(capsys) -> None:
    node0 = LaunchOptions("train.py", nnodes=2, node_rank=0, master_addr="10.0.0.1", master_port=29400)
    node1 = LaunchOptions("train.py", nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29400)
    arguments = torchrun_arguments(node1)
    assert "--node-rank=1" in arguments and "--master-addr=10.0.0.1" in arguments
    assert resolve_run_id(node0, {}) == resolve_run_id(node1, {})
    assert "--run-id" in capsys.readouterr().err  # told how to keep separate runs apart
    assert resolve_run_id(LaunchOptions("train.py", nnodes=2, run_id="exp-7"), {}) == "exp-7"


def test_run_ids_come_from_option_then_environment_then_fresh() -> None:
    options = LaunchOptions("train.py")
    assert resolve_run_id(options, {"TRACEML_RUN_ID": "from-env"}) == "from-env"
    assert resolve_run_id(options, {}) != resolve_run_id(options, {})
    assert resolve_run_id(options, {}).startswith("train-")


def test_exit_codes_follow_the_shell() -> None:
    assert exit_code_of(0) == 0 and exit_code_of(3) == 3 and exit_code_of(-15) == 143
