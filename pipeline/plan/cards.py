"""GPUs known by name (`memory.total`: nvidia-smi's, MiB), and the memory the planner assumes each really offers:
CUDA reports about 2% less as the device's total (torch.cuda.get_device_properties: 14.7 GiB on a 15360 MiB T4, the
figure gpu_settings.py keys its tiers on, and vLLM's gpu_memory_utilization is a share of), and the process's own
CUDA context and allocator slack (CUDA_CONTEXT_GIB) is not usable by tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from grpo_pipeline.env.probes import nvidia_smi_memory
from grpo_pipeline.pipeline.config import ConfigError

MIB = 2**20
GIB = 2**30
REPORTED_TOTAL_FRACTION = 0.98
CUDA_CONTEXT_GIB = 0.5


@dataclass(frozen=True)
class Card:
    name: str
    nominal_gb: float  # as sold: "16 GB"
    memory_total_mib: float  # nvidia-smi memory.total
    memory_free_mib: Optional[float] = None  # a live GPU's memory.free; None for a named card

    @property
    def total_gib(self) -> float:
        return self.memory_total_mib * MIB * REPORTED_TOTAL_FRACTION / GIB

    @property
    def usable_gib(self) -> float:
        free = self.memory_total_mib if self.memory_free_mib is None else min(self.memory_free_mib,
                                                                              self.memory_total_mib)
        return max(0.0, free * MIB * REPORTED_TOTAL_FRACTION / GIB - CUDA_CONTEXT_GIB)

    def describe(self) -> str:
        free = "" if self.memory_free_mib is None else f", {self.memory_free_mib / 1024:.1f} GiB free now"
        return (f"{self.name} ({self.nominal_gb:g} GB: CUDA total {self.total_gib:.1f} GiB{free}, "
                f"{self.usable_gib:.1f} GiB usable after the CUDA context)")


# name -> (nominal GB, nvidia-smi memory.total in MiB)
KNOWN_CARDS: dict[str, Card] = {card.name: card for card in (
    Card("T4", 16, 15360),
    Card("L4", 24, 23034),
    Card("A10", 24, 23028),
    Card("RTX 3090", 24, 24576),
    Card("RTX 4090", 24, 24564),
    Card("A100 40GB", 40, 40960),
    Card("A100 80GB", 80, 81920),
    Card("A800 80GB", 80, 81920),
    Card("H100 80GB", 80, 81559),
    Card("H200", 141, 143771),
)}
TABLE_CARDS = ("T4", "L4", "RTX 4090", "A100 40GB", "A100 80GB", "H200")


def _key(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum()).removeprefix("nvidia").removeprefix("geforce")


def card_by_name(name: str) -> Card:
    """A known card from a loose spelling: `t4`, `RTX4090`, `4090`, `a100-80gb`, `A100` (the 40 GB one).

    >>> card_by_name("rtx-4090").name, card_by_name("a100-80GB").name, card_by_name("A100").name
    ('RTX 4090', 'A100 80GB', 'A100 40GB')
    """
    wanted = _key(name)
    aliases = {"a100": "A100 40GB", "a800": "A800 80GB", "h100": "H100 80GB", "a10g": "A10", "3090": "RTX 3090",
               "4090": "RTX 4090"}
    for card in KNOWN_CARDS.values():
        if _key(card.name) in (wanted, wanted.removeprefix("rtx")) or _key(card.name) == "rtx" + wanted:
            return card
    if wanted in aliases:
        return KNOWN_CARDS[aliases[wanted]]
    raise ConfigError("gpu", f"unknown GPU {name!r}. Known: {', '.join(KNOWN_CARDS)}; or give the memory with "
                      "--gpu_memory_gb N (the total in GiB, nvidia-smi memory.total / 1024).")


def card_from_memory(total_gib: float) -> Card:
    """A card given only by its memory (`gpu_memory_gb`: nvidia-smi's memory.total in GiB)."""
    return Card(f"{total_gib:g} GiB GPU", total_gib, total_gib * 1024)


def live_card() -> Optional[Card]:
    """The first visible GPU from nvidia-smi (no torch), with its free memory; None without one."""
    found = nvidia_smi_memory()
    if found is None:
        return None
    return Card(found["name"], round(found["total_mib"] / 1024), found["total_mib"], found["free_mib"])
