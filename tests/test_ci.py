"""CI runs exactly the README's test command, and that command installs what the tests need."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_runs_the_quick_starts_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quick, re.S)
    assert block is not None, "the quick start has no bash block"
    commands = block.group(1).strip().splitlines()
    test_command = commands[-1]
    assert test_command.endswith("python -m pytest -q")
    # What the tests need: the project with its test and ucx extras, the example and KVCR plugins,
    # and SGLang through the CPU-safe installer (never a plain `pip install sglang`).
    assert "-e '.[test,ucx]'" in test_command and "plugins/kvcr-policy-example" in test_command
    assert "-e plugins/kvcr-policy-kvcr" in test_command  # the KVCR runner and its plugin
    assert "bash .ci/install-sglang.sh" in test_command
    assert "sglang" not in test_command.replace("bash .ci/install-sglang.sh", "")
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert [line for line in ci if "pytest" in line and not line.startswith("#")] == [test_command]
    assert "export HYPOTHESIS_PROFILE=ci" in "\n".join(ci)
