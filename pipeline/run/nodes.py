"""Every node of a multi-node run started alike: the same recipe, the same code, the launcher's world size.

Before anything loads, every process puts what it was started with (recipe, code hash, package versions, world
size) into torchrun's agent store and reads everyone else's; one that never reports is named after NODES_TIMEOUT_S.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Optional

from grpo_pipeline.env.kept import changed_inputs, state_key, versions
from grpo_pipeline.env.secret_fields import masked
from grpo_pipeline.pipeline.config import ConfigError
from grpo_pipeline.pipeline.run.manifest import RECORDED_PACKAGES, git_commit

NODES_TIMEOUT_S = 300
KEY_PREFIX = "grpo-pipeline/nodes"
CODE_FOLDERS = ("pipeline", "rewards", "env")


def code_version(root: Optional[Path] = None) -> str:
    """sha256 of every .py file of pipeline/, rewards/ and env/ (path and bytes): two checkouts of the same commit
    with an edit in one differ."""
    root = root or Path(__file__).resolve().parents[2]
    digest = hashlib.sha256()
    for folder in CODE_FOLDERS:
        for path in sorted((root / folder).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def launcher_env(environ: Mapping[str, str] = os.environ) -> Optional[dict[str, int]]:
    """What the launcher told this process (rank, world size, its node and that node's process count), or None for
    a single process."""
    try:
        world = int(environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        return {"rank": int(environ["RANK"]), "world_size": world,
                "node": int(environ.get("GROUP_RANK", environ.get("NODE_RANK", "0"))),
                "local_world_size": int(environ.get("LOCAL_WORLD_SIZE", world))}
    except (KeyError, ValueError):
        return None


def node_record(recipe: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """What this process was started with (`recipe`: the recipe's values, flat, secrets masked: a secret never
    leaves its node)."""
    launched = launcher_env(environ) or {"rank": 0, "world_size": 1, "node": 0, "local_world_size": 1}
    recipe = masked(dict(recipe))
    return {**launched, "host": socket.gethostname(), "recipe_key": state_key(recipe), "recipe": recipe,
            "code": code_version(), "git_commit": git_commit(), "packages": versions(*RECORDED_PACKAGES)}


def differences(records: list[dict[str, Any]]) -> list[str]:
    """What differs between rank 0's record and each other's, one phrase per difference; [] when all agree.

    >>> base = {"rank": 0, "node": 0, "host": "a", "recipe_key": "k", "recipe": {"lr": 1}, "code": "c",
    ...         "git_commit": "g", "packages": {"trl": "1"}, "world_size": 2}
    >>> differences([base, {**base, "rank": 1, "node": 1}])
    []
    >>> differences([base, {**base, "rank": 1, "node": 1, "recipe_key": "x", "recipe": {"lr": 2}}])
    ['node 1 (host a, rank 1) has another recipe: lr differs (1 on node 0, 2 there)']
    """
    first, found = records[0], []
    for other in records[1:]:
        where = f"node {other['node']} (host {other['host']}, rank {other['rank']})"
        if other["recipe_key"] != first["recipe_key"]:
            fields = changed_inputs(first["recipe"], other["recipe"])
            found.append(f"{where} has another recipe: " + "; ".join(
                f"{name} differs ({_value(first['recipe'], name)} on node 0, {_value(other['recipe'], name)} there)"
                for name in fields))
        if other["code"] != first["code"]:
            found.append(f"{where} runs another version of the code (source hash {other['code'][:12]}, git commit "
                         f"{other['git_commit'] or 'unknown'}; node 0: {first['code'][:12]}, git commit "
                         f"{first['git_commit'] or 'unknown'})")
        packages = changed_inputs(first["packages"], other["packages"])
        if packages:
            found.append(f"{where} has other package versions: " + "; ".join(
                f"{name} {other['packages'].get(name)} there, {first['packages'].get(name)} on node 0"
                for name in packages))
        if other["world_size"] != first["world_size"]:
            found.append(f"{where} was told world size {other['world_size']} by its launcher, node 0 "
                         f"{first['world_size']}")
    return found


def _value(recipe: Mapping[str, Any], name: str) -> str:
    return json.dumps(masked(recipe.get(name, "(unset)"), name), default=str)[:60]  # a record from an older node


def exchange(record: dict[str, Any], environ: Mapping[str, str] = os.environ, store: Any = None,
             timeout_s: float = NODES_TIMEOUT_S) -> list[dict[str, Any]]:
    """Put this process's record in the launcher's store and read every process's, in rank order."""
    if store is None:  # a client of the launcher's TCPStore (torchrun's agent hosts it at MASTER_ADDR:MASTER_PORT)
        import torch.distributed as dist  # lazy: torch

        store = dist.TCPStore(environ["MASTER_ADDR"], int(environ["MASTER_PORT"]), is_master=False,
                              timeout=timedelta(seconds=timeout_s))
    prefix = f"{KEY_PREFIX}/{environ.get('TORCHELASTIC_RUN_ID', 'none')}/{environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    store.set(f"{prefix}/{record['rank']}", json.dumps(record, default=str))
    records = []
    for rank in range(record["world_size"]):
        try:
            records.append(json.loads(store.get(f"{prefix}/{rank}")))
        except RuntimeError:  # torch's store timeout (DistStoreError is a RuntimeError)
            raise ConfigError("nodes", f"process {rank} of {record['world_size']} did not report within "
                              f"{timeout_s:.0f} s: its node failed before this check (see its own output) or was "
                              "started with another --main_process_ip/--main_process_port. Start every node with "
                              "the same accelerate config and launch line, changing only --machine_rank.") from None
    return records


def check_nodes(recipe: Mapping[str, Any], environ: Mapping[str, str] = os.environ, store: Any = None,
                timeout_s: float = NODES_TIMEOUT_S) -> str:
    """The check's `nodes` line: one process, or every process started alike (else a ConfigError naming what
    differs, on every node). `recipe`: this process's recipe values, flat (PipelineConfig.to_dict)."""
    launched = launcher_env(environ)
    if launched is None:
        return "one process"
    if store is None and environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return (f"{launched['world_size']} processes, not compared across nodes (not started by accelerate launch "
                "or torchrun, whose store the comparison uses)")
    records = exchange(node_record(recipe, environ), environ, store, timeout_s)
    found = differences(records)
    if found:
        raise ConfigError("nodes", "the processes of this run were not started alike: " + "; ".join(found)
                          + ". Start every node from the same checkout and packages with the same recipe and "
                          "command line (only --machine_rank differs); see docs/scale-out.md.")
    nodes = sorted({r["node"] for r in records})
    per_node = ", ".join(f"node {n}: {sum(r['node'] == n for r in records)}" for n in nodes)
    return (f"{len(nodes)} node(s), {len(records)} processes ({per_node}); every process: recipe "
            f"{records[0]['recipe_key'][:12]}, code {records[0]['code'][:12]}, same package versions")


def leave_process_group() -> None:
    """Destroy a launched process's default process group before it exits, as torch asks: left to the interpreter's
    exit, gloo's threads can be torn down still joinable, and a completed rank aborts ("terminate called without an
    active exception") and its launcher reports the run failed."""
    if launcher_env() is None:
        return
    import torch.distributed as dist  # lazy: torch

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
