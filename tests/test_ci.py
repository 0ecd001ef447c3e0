"""CI runs exactly the README's test command, and that command installs what the tests need;
the layout of the tests, and the CPU hog the suite runs under (tests/support/load.py)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from tests.support.load import CpuHog, cores
from tests.support.paths import ROOT, child_env
from tests.support.waiting import wait_until


def test_ci_runs_the_quick_starts_test_command() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", quick, re.S)
    assert block is not None, "the quick start has no bash block"
    commands = block.group(1).strip().splitlines()
    test_command = commands[-1]
    assert test_command == "bash .ci/install-tests.sh && python -m pytest -q"
    # What the tests need: the project with its test and ucx extras, the example plugin,
    # SGLang through the CPU-safe installer (never a plain `pip install sglang`), Prometheus.
    script = (ROOT / ".ci/install-tests.sh").read_text(encoding="utf-8")
    assert "-e '.[test,ucx]'" in script and "plugins/kvcr-policy-example" in script
    assert "bash .ci/install-sglang.sh" in script and "prometheus" in script
    assert "-e plugins/kvcr-policy-kvcr" in script  # the KVCR runner and its plugin
    assert "plugins/kvcr-policy-mooncake" in script and "bash .ci/install-mooncake.sh" in script
    commands = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in commands if "pip install" in line and "sglang" in line]
    assert "torch==2.13.0" in script
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8").splitlines()
    assert [line for line in ci if "pytest" in line and not line.startswith("#")] == [test_command]
    assert "export HYPOTHESIS_PROFILE=ci" in "\n".join(ci)


def test_the_tests_mirror_the_package() -> None:
    """tests/X/Y holds the tests of kvcr_policy/X/Y; tests/plugins/NAME those of the plugin
    plugins/kvcr-policy-NAME; tests/docs those of the documentation site docs/ (tests/README.md)."""
    tests = ROOT / "tests"
    folders = {path.parent.relative_to(tests) for path in tests.rglob("test_*.py")}
    strays = []
    for folder in sorted(folders):
        parts = folder.parts
        if parts == ("docs",):
            if not (ROOT / "docs" / "index.md").is_file() or not (ROOT / "mkdocs.yml").is_file():
                strays.append("tests/docs: there is no docs site (docs/index.md, mkdocs.yml)")
        elif parts and parts[0] == "plugins":
            if len(parts) != 2 or not (ROOT / "plugins" / f"kvcr-policy-{parts[1]}").is_dir():
                strays.append(f"tests/{folder}: not tests/plugins/<plugin>")
        elif not (ROOT / "kvcr_policy" / folder / "__init__.py").is_file():
            strays.append(f"tests/{folder}: kvcr_policy/{folder} is not a package")
    assert not strays, "move these tests to the folder of what they test:\n" + "\n".join(strays)


def _contract(name: str) -> dict[str, Any]:
    """The import-linter contract of pyproject.toml named ``name``."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    return next(c for c in contracts if c["name"] == name)


def test_the_import_contracts_name_every_package() -> None:
    """A new package is checked for cycles, and a new root module or package is refused the
    command line, without anyone remembering to list it."""
    package = ROOT / "kvcr_policy"
    packages = {f"kvcr_policy.{p.parent.name}" for p in package.glob("*/__init__.py")}
    modules = {f"kvcr_policy.{p.stem}" for p in package.glob("*.py")} - {
        "kvcr_policy.__init__", "kvcr_policy.__main__"
    }  # fmt: skip
    acyclic = set(_contract("No import cycles")["ancestors"])
    assert packages - acyclic == set()
    below = set(_contract("Nothing below the command line imports it")["source_modules"])
    assert (packages | modules) - {"kvcr_policy.cli"} == below


def test_no_two_test_files_share_a_name() -> None:
    """pytest imports a test file by its base name (the folders have no __init__.py): a second
    file of the same name anywhere under tests/ fails the whole run at collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    clashes = {name: paths for name, paths in names.items() if len(paths) > 1}
    assert not clashes, f"rename one of each: {clashes}"


def test_every_test_path_the_docs_name_exists() -> None:
    docs = [ROOT / "README.md", ROOT / "tests" / "README.md", ROOT / ".ci" / "run"]
    docs += sorted((ROOT / "docs").rglob("*.md")) + sorted((ROOT / "plugins").glob("*/README.md"))
    # A path followed by a wildcard or a placeholder (tests/test_*.py) is a pattern, not a path.
    paths = r"(?<![\w/])(tests/[\w/.-]*\w)(?![\w*</])"
    named = {m for doc in docs for m in re.findall(paths, doc.read_text(encoding="utf-8"))}
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert named and not missing, missing


def test_the_cpu_hog_runs_a_command_and_leaves_no_process_behind() -> None:
    """tests/README.md's second hog command, with a short command: its status comes back, the
    hog ran while it ran (two busy processes per core), and every PID it started is gone."""
    probe = "import sys; sys.exit(3)"
    done = subprocess.run(
        [sys.executable, "-m", "tests.support.load", "--seconds", "60", "--", sys.executable,
         "-c", probe],
        capture_output=True, text=True, timeout=120, cwd=ROOT, env=child_env(),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    pids = [int(p) for p in re.search(r"\(pids ([\d ]+)\)", done.stderr).group(1).split()]
    assert len(pids) == 2 * cores()
    assert not [pid for pid in pids if Path(f"/proc/{pid}").exists()]


def test_a_hog_ends_by_itself_at_its_deadline_and_stop_kills_only_its_own() -> None:
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        hog = CpuHog(seconds=600.0, processes=2).start()
        assert hog.running() == 2
        hog.stop()
        assert hog.running() == 0 and hog.pids == [] and bystander.poll() is None
        short = CpuHog(seconds=0.5, processes=1).start()
        wait_until(lambda: short.running() == 0, "the busy process ending at its deadline", 120)
        short.stop()
    finally:
        bystander.kill()
        bystander.wait()
