"""plan, bench and tune take the same geometry options, a model's config.json among them, and
measure or plan the pages that model's rank holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.model.test_hf_config import DEEPSEEK_V3, QWEN3_32B
from tests.support.commands import run_main

pytestmark = pytest.mark.usefixtures("clean_env")

OPTIONS = ("--geometry", "--model-config", "--layers", "--heads", "--head-dim", "--dtype",
           "--page-size", "--mla", "--tp")  # fmt: skip


@pytest.fixture
def configs(tmp_path: Path) -> dict[str, Path]:
    found = {}
    for name, config in (("qwen3", QWEN3_32B), ("deepseek", DEEPSEEK_V3)):
        found[name] = tmp_path / name / "config.json"
        found[name].parent.mkdir()
        found[name].write_text(json.dumps(config))
    return found


@pytest.mark.parametrize("command", ["plan", "bench", "tune"])
def test_every_command_takes_the_geometry_options(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    code, out, _ = run_main(capsys, command, "--help")
    assert code == 0
    for option in OPTIONS:
        assert option in out, (command, option)


def test_plan_reads_an_mla_config_and_a_tp_size(
    capsys: pytest.CaptureFixture[str], configs: dict[str, Path]
) -> None:
    code, out, err = run_main(capsys, "plan", "--model-config", str(configs["deepseek"]),
                              "--page-size", "64", "--tp", "8", "--tokens", "4096",
                              "--host-memory", "1TiB", "--format", "json")  # fmt: skip
    assert code == 0, err
    geometry = json.loads(out)["geometry"]
    # The MLA latent is whole on every rank: a rank holds what the model does.
    assert geometry["bytes_per_token_rank"] == geometry["bytes_per_token_model"] == 61 * 576 * 2
    assert geometry["fragments_per_page"] == 61 and geometry["mla"]


def test_plan_divides_a_gqa_configs_kv_heads_by_tp(
    capsys: pytest.CaptureFixture[str], configs: dict[str, Path]
) -> None:
    code, out, err = run_main(capsys, "plan", "--model-config", str(configs["qwen3"]),
                              "--page-size", "64", "--tp", "8", "--tokens", "4096",
                              "--host-memory", "1TiB", "--format", "json")  # fmt: skip
    assert code == 0, err
    geometry = json.loads(out)["geometry"]
    assert geometry["heads_per_rank"] == 1 and geometry["bytes_per_page_rank"] == 2 << 20


def test_bench_measures_one_tp_ranks_pages_of_a_config(
    capsys: pytest.CaptureFixture[str], configs: dict[str, Path]
) -> None:
    """A real run on host memory: Qwen3-32B's pages of 16 tokens at TP 8 (512 KiB each)."""
    code, out, err = run_main(capsys, "bench", "--model-config", str(configs["qwen3"]),
                              "--page-size", "16", "--tp", "8", "--tokens", "2048",
                              "--scatter", "--repeat", "1", "--format", "json")  # fmt: skip
    assert code == 0, err
    result = json.loads(out)
    assert result["geometry"] == "Qwen3-32B" and result["verified"]
    assert result["page_bytes"] == 16 * 64 * 1 * 128 * 2 * 2 and result["pages"] == 128


@pytest.mark.parametrize("command", ["bench", "tune"])
def test_a_token_count_of_no_whole_pages_names_the_model(
    capsys: pytest.CaptureFixture[str], configs: dict[str, Path], command: str
) -> None:
    code, _, err = run_main(capsys, command, "--model-config", str(configs["qwen3"]),
                            "--page-size", "16", "--tokens", "100")  # fmt: skip
    assert code == 2
    assert "expected whole pages of 'Qwen3-32B' (16 tokens each), got 100" in err
    code, _, err = run_main(capsys, command, "--model-config", str(configs["qwen3"]),
                            "--tokens", "100")  # fmt: skip
    assert code == 2 and "missing: page_size" in err
