"""Every node of a multi-node run started alike (pipeline/run/nodes.py), through a real TCPStore on 127.0.0.1 as
torchrun's agent hosts it: two "nodes" are two threads here, each with the environment its launcher would give it."""

import threading
from datetime import timedelta

import pytest

from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.run import nodes
from train_helpers import demo_config


def _launched(rank: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "TORCHELASTIC_USE_AGENT_STORE": "True"}


def _two_nodes(tmp_path, cfgs, timeout_s: float = 30, code=None, monkeypatch=None) -> list:
    """check_nodes on two threads against one store; each thread's line or ConfigError."""
    import torch.distributed as dist

    host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    results: list = [None, None]

    def node(rank: int) -> None:
        try:
            store = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timedelta(seconds=timeout_s))
            results[rank] = nodes.check_nodes(cfgs[rank].to_dict(), _launched(rank, host.port), store, timeout_s)
        except ConfigError as err:
            results[rank] = err

    threads = [threading.Thread(target=node, args=(rank,)) for rank in range(len(cfgs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_nodes_started_alike_pass_and_say_so(tmp_path):
    cfg = demo_config(tmp_path / "run")
    lines = _two_nodes(tmp_path, [cfg, cfg])
    assert all(isinstance(line, str) for line in lines), lines
    assert lines[0] == lines[1] and "2 node(s), 2 processes (node 0: 1, node 1: 1)" in lines[0]


def test_a_node_with_another_recipe_is_refused_on_every_node_naming_the_field(tmp_path):
    cfg = demo_config(tmp_path / "run")
    errors = _two_nodes(tmp_path, [cfg, cfg.replace(learning_rate=5e-5, max_steps=5)])
    for err in errors:
        assert isinstance(err, ConfigError) and err.field == "nodes", err
        assert "node 1 (host" in str(err) and "has another recipe" in str(err)
        assert "learning_rate differs (0.001 on node 0, 5e-05 there)" in str(err)
        assert "max_steps differs (3 on node 0, 5 there)" in str(err)


def test_a_node_with_another_code_version_is_refused(tmp_path, monkeypatch):
    cfg = demo_config(tmp_path / "run")
    real = nodes.node_record

    def record(cfg, environ):  # node 1 runs an edited checkout: its source hash differs
        found = real(cfg, environ)
        return {**found, "code": "0" * 64} if environ["RANK"] == "1" else found

    monkeypatch.setattr(nodes, "node_record", record)
    errors = _two_nodes(tmp_path, [cfg, cfg])
    for err in errors:
        assert isinstance(err, ConfigError) and "runs another version of the code (source hash 000000000000" in str(err)


def test_a_node_that_never_reports_is_named_after_the_timeout(tmp_path):
    """Node 1 failed before the check (or was started on another port): node 0 waits, then names it."""
    import torch.distributed as dist

    host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    store = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timedelta(seconds=2))
    with pytest.raises(ConfigError, match=r"process 1 of 2 did not report within 2 s"):
        nodes.check_nodes(demo_config(tmp_path / "run").to_dict(), _launched(0, host.port), store, timeout_s=2)


def test_one_process_and_a_foreign_launcher_are_not_compared(tmp_path):
    cfg = demo_config(tmp_path / "run")
    assert nodes.check_nodes(cfg.to_dict(), {}) == "one process"
    foreign = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # srun, mpirun
    assert "not compared across nodes" in nodes.check_nodes(cfg.to_dict(), foreign)


def test_the_code_version_covers_every_source_file_of_the_pipeline(tmp_path):
    for folder in nodes.CODE_FOLDERS:
        (tmp_path / folder / "sub").mkdir(parents=True)
        (tmp_path / folder / "sub" / "a.py").write_text("x = 1\n")
    before = nodes.code_version(tmp_path)
    (tmp_path / "pipeline" / "sub" / "a.py").write_text("x = 2\n")
    assert nodes.code_version(tmp_path) != before


@pytest.mark.parametrize("field, secrets", [
    ("hub_token", ("hf_node0_token", "hf_node1_token")),
    ("model_init_kwargs", ({"token": "hf_nested0_tok"}, {"token": "hf_nested1_tok"})),
    ("hub_model_id", ("https://me:node0pass@host/m", "https://me:node1pass@host/m")),
])
def test_no_node_prints_a_secret_of_its_own_or_of_another_node(tmp_path, field, secrets):
    """A secret by name, nested in a mapping option, or in a URL's user-info: each node's record carries it masked
    (env/secret_fields.py masked), so no node's refusal can show another node's value, which its own redact never
    learned."""
    from grpo_pipeline.env.secret_fields import secrets_in

    cfg = demo_config(tmp_path / "run")
    errors = _two_nodes(tmp_path, [cfg.replace(**{field: secrets[0]}),
                                   cfg.replace(**{field: secrets[1]}, learning_rate=5e-5)])
    values = [value for secret in secrets for value, _ in secrets_in({field: secret})]
    assert len(values) == 2
    for err in errors:
        assert isinstance(err, ConfigError) and "learning_rate differs" in str(err), err
        assert not [value for value in values if value in str(err)], str(err)
    record = nodes.node_record(cfg.replace(**{field: secrets[1]}).to_dict(), {})
    assert values[1] not in str(record)
