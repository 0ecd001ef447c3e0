"""``kvcr-policy sglang-config``: the extra-config JSON for a profile, and checking a flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvcr_policy.memory.linux import use_roots
from tests.support.cgroups import GIB, FakeHost
from tests.support.commands import run_command, run_main

FLAG = "SGLang --hicache-storage-backend-extra-config"
MODULE = "kvcr_policy.integrations.sglang"


def test_it_prints_the_json_that_loads_the_backend(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run_main(
        capsys,
        "sglang-config",
        "--profile",
        "throughput",
        "--set",
        "placement.capacity_bytes=64GiB",
    )
    assert status == 0 and err == ""
    assert json.loads(out) == {
        "backend_name": "kvcr_policy",
        "module_path": "kvcr_policy.integrations.sglang",
        "class_name": "KVCRPolicyStorage",
        "interface_v1": 1,
        "profile": "throughput",
        "overrides": {"placement.capacity_bytes": "64GiB"},
    }
    assert len(out.strip().splitlines()) == 1  # one line: fits "$(...)" on a command line


def test_a_typo_exits_2_with_one_message_and_no_traceback() -> None:
    done = run_command("sglang-config", "--profile", "thruput")
    assert done.returncode == 2 and done.stdout == ""
    assert "did you mean 'throughput'" in done.stderr and "Traceback" not in done.stderr
    done = run_command("sglang-config", "--set", "batching.read_bach_pages=64")
    assert done.returncode == 2 and "batching.read_batch_pages" in done.stderr


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (
            '{"backend_name": "kvcr_policy", "module_path": "kvcr_policy.integrations.sglang", '
            '"class_name": "KVCRPolicyStorage", "profil": "x"}',
            "did you mean",
        ),
        ('{"module_path": "kvcr_policy.integrations.sglang",', "not valid JSON"),
        ("@/nonexistent/sglang-extra.json", "cannot read the file (No such file or directory)"),
    ],
)
def test_check_reports_a_bad_flag_in_one_message(
    capsys: pytest.CaptureFixture[str], value: str, expected: str
) -> None:
    status, out, err = run_main(capsys, "sglang-config", "--check", value)
    assert status == 2 and out == ""
    assert expected in err and err.count("\n  - ") == 1


def test_check_reads_a_file_as_sglang_does_and_says_where_values_come_from(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = tmp_path / "sglang-extra.toml"
    path.write_text(
        'backend_name = "kvcr_policy"\nmodule_path = "kvcr_policy.integrations.sglang"\n'
        'class_name = "KVCRPolicyStorage"\ninterface_v1 = 1\nprofile = "throughput"\n'
        '[overrides]\n"batching.read_batch_pages" = 512\n'
    )
    status, out, err = run_main(capsys, "sglang-config", "--check", f"@{path}")
    assert status == 0, err
    report = json.loads(out)
    assert (
        report["loads"] and report["interface_v1"] and report["profile"].endswith("throughput.toml")
    )
    assert report["changed"]["batching.read_batch_pages"] == {
        "value": 512,
        "from": f"{FLAG} ['overrides']['batching.read_batch_pages']",
    }


LOADER = '"backend_name": "kvcr_policy", "module_path": "kvcr_policy.integrations.sglang"'


@pytest.mark.parametrize(
    ("flag", "says"),
    [
        (
            "{}",
            [f"extra_config.{key} (from" for key in ("backend_name", "module_path", "class_name")],
        ),
        (
            '{"backend_name": "x", "module_path": "other.module", "class_name": "C", "k": 1}',
            ["SGLang would load 'other.module', not this backend", "SGLang would load 'C'"],
        ),
        ("{" + LOADER + ', "class_name": "HiCacheFile"}', ["SGLang would load 'HiCacheFile'"]),
        ("{" + LOADER + "}", ["missing; SGLang's dynamic loader needs it: 'class_name'"]),
    ],
    ids=["empty", "another-backend", "another-class", "no-class"],
)
def test_check_fails_whenever_sglang_would_not_load_this_backend(
    capsys: pytest.CaptureFixture[str], flag: str, says: list[str]
) -> None:
    """Red team 2026-12-c, C10: these printed "loads" and exited 0, so a launch script that
    gated on the exit status passed a flag that failed at SGLang's start."""
    status, out, err = run_main(capsys, "sglang-config", "--check", flag)
    assert status == 2 and out == "", err
    assert all(said in err for said in says), err
    for module in ("kvcr_policy.integrations.sglang", "kvcr_policy.integrations.sglang.storage"):
        good = {"backend_name": "any", "module_path": module, "class_name": "KVCRPolicyStorage"}
        status, out, err = run_main(capsys, "sglang-config", "--check", json.dumps(good))
        assert status == 0 and json.loads(out)["loads"] is True, err


def _docs_section() -> str:
    from tests.support.paths import ROOT

    return (ROOT / "docs" / "sglang.md").read_text(encoding="utf-8")


def test_the_docs_examples_run_as_written(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    section = _docs_section()
    command = "kvcr-policy sglang-config --profile throughput --set placement.capacity_bytes=64GiB"
    shown = section.split(command + "\n# ", 1)[1].split("\n", 1)[0]
    status, out, _ = run_main(capsys, *command.split()[1:])
    assert status == 0 and out.strip() == shown
    toml = section.split("```toml\n", 1)[1].split("```", 1)[0]
    path = tmp_path / "sglang.toml"
    path.write_text(toml, encoding="utf-8")
    assert "kvcr-policy sglang-config --check @/etc/kvcr/sglang.toml" in section
    # Faked: a 512 GiB host, where the documented 64 GiB tier fits (this machine has less).
    host = FakeHost(tmp_path / "host", total=512 * GIB, available=400 * GIB)
    with use_roots(proc=host.proc, sys=host.sys):
        status, out, err = run_main(capsys, "sglang-config", "--check", f"@{path}")
    assert status == 0, err
    assert json.loads(out)["changed"]["placement.capacity_bytes"]["value"] == 64 << 30
    bad = '\'{"module_path": "kvcr_policy.integrations.sglang",\''
    assert f"kvcr-policy sglang-config --check {bad}" in section
    status, _, err = run_main(capsys, "sglang-config", "--check", bad.strip("'"))
    assert status == 2 and "not valid JSON (Expecting property name" in err


def test_check_refuses_a_tier_larger_than_this_host(capsys: pytest.CaptureFixture[str]) -> None:
    """Real: no host has 200 TiB. The origin names the flag's key, the binding file is read."""
    flag = json.dumps({"backend_name": "kvcr_policy", "module_path": MODULE,
                       "class_name": "KVCRPolicyStorage",
                       "overrides": {"placement.capacity_bytes": "200TiB"}})  # fmt: skip
    status, out, err = run_main(capsys, "sglang-config", "--check", flag)
    assert status == 2 and out == ""
    origin = f"{FLAG} ['overrides']['placement.capacity_bytes']"
    assert f"placement.capacity_bytes = 200TiB (from {origin}) is more than the memory" in err
    assert "this host holds" in err and "lower placement.capacity_bytes to at most" in err


def test_format_json_is_the_report_of_both_modes(capsys: pytest.CaptureFixture[str]) -> None:
    flag = json.dumps(
        {
            "backend_name": "kvcr_policy",
            "module_path": "kvcr_policy.integrations.sglang",
            "class_name": "KVCRPolicyStorage",
        }
    )
    for args in ([], ["--check", flag]):
        code, out, err = run_main(capsys, "sglang-config", *args, "--format", "json")
        assert code == 0, err
        assert isinstance(json.loads(out), dict)


@pytest.mark.parametrize(("v1", "warned"), [(0, True), (1, False)])
def test_check_warns_that_interface_v1_off_takes_sglang_s_slower_path(
    capsys: pytest.CaptureFixture[str], v1: int, warned: bool
) -> None:
    flag = "{" + LOADER + f', "class_name": "KVCRPolicyStorage", "interface_v1": {v1}}}'
    status, out, err = run_main(capsys, "sglang-config", "--check", flag)
    assert status == 0, err
    warnings = json.loads(out)["warnings"]
    assert bool(warnings) is warned and ("warning: interface_v1 is off" in err) is warned
    if warned:
        assert "two extra copies per page" in warnings[0]
