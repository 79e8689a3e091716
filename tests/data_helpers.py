"""Config and input builders shared by the grpo_pipeline.pipeline.data.prepare tests (tests/test_data*.py)."""

import json

from grpo_pipeline.pipeline.config import PipelineConfig
from grpo_pipeline.pipeline.data.source_spec import SAMPLE_PATH


def make_cfg(tmp_path, **overrides):
    values = {"dataset_name": "sample", "data_cache_dir": str(tmp_path / "cache"), "output_dir": str(tmp_path / "run")}
    values.update(overrides)
    return PipelineConfig().replace(**values)


def write_jsonl(path, rows, newline="\n", bom=False):
    text = newline.join(json.dumps(row, ensure_ascii=False) for row in rows) + newline
    path.write_bytes((("\ufeff" if bom else "") + text).encode("utf-8"))
    return path


def sample_rows():
    with open(SAMPLE_PATH, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def assert_counts_add_up(report):
    rejected = sum(info["count"] for info in report["rows_rejected"].values())
    assert rejected == report["rows_rejected_total"]
    assert report["rows_in"] == report["rows_kept"] + rejected + report["rows_unused_max_samples"]

