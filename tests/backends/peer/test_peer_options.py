"""UcxOptions, the UCX environment knobs, and the registration of the ucx transport."""

from __future__ import annotations

import subprocess
import sys

import pytest
from pydantic import ValidationError

from kvcr_policy.backends.peer.env import apply_env, desired_env, progress_mode
from kvcr_policy.backends.peer.options import UcxOptions, is_loopback, parse_address


def test_addresses_parse_and_bad_ones_say_why() -> None:
    assert parse_address("127.0.0.1:7480") == ("127.0.0.1", 7480)
    assert parse_address("[::1]:9") == ("::1", 9)
    for bad, match in (("nohost", "HOST:PORT"), ("h:x", "integer"), ("h:70000", "0..65535")):
        with pytest.raises(ValueError, match=match):
            parse_address(bad)
    with pytest.raises(ValidationError, match="HOST:PORT"):
        UcxOptions(peer="localhost")
    assert is_loopback("127.0.0.2") and is_loopback("localhost") and not is_loopback("0.0.0.0")


def test_env_option_takes_only_ucx_variables() -> None:
    with pytest.raises(ValidationError, match="only UCX_"):
        UcxOptions(env={"LD_PRELOAD": "x"})


def test_knobs_apply_only_where_the_user_has_not_spoken() -> None:
    options = UcxOptions(rndv_thresh="64KiB", tcp_seg_size="1MiB", net_devices="lo", tls="tcp")
    environ = {"UCX_RNDV_THRESH": "4096", "UCXPY_PROGRESS_MODE": "polling"}
    report = apply_env(options, environ)
    assert environ["UCX_RNDV_THRESH"] == "4096"  # the user's value stays
    assert report.values["UCX_RNDV_THRESH"] == ("4096", "user env")
    assert report.ignored["UCX_RNDV_THRESH"] == str(64 << 10)
    assert environ["UCX_TCP_TX_SEG_SIZE"] == environ["UCX_TCP_RX_SEG_SIZE"] == str(1 << 20)
    assert report.values["UCX_NET_DEVICES"] == ("lo", "config")
    assert environ["UCX_TLS"] == "tcp,self"
    assert report.progress_mode == ("polling", "env UCXPY_PROGRESS_MODE")
    assert "UCX_MAX_RNDV_RAILS" in report.to_dict()["env"]  # ucxx's own defaults are shown


def test_defaults_keep_ucx_choices_except_the_measured_ones() -> None:
    wanted = desired_env(UcxOptions())
    assert wanted["UCX_TCP_TX_SEG_SIZE"] == str(512 << 10)
    assert "UCX_RNDV_THRESH" not in wanted
    # Cross-memory attach is left out unless asked for: a peer dying mid-transfer over it
    # aborts this process (UCX has no error handling on shared-memory endpoints).
    assert wanted["UCX_TLS"] == "self,posix,tcp"
    assert "UCX_TLS" not in desired_env(UcxOptions(cma=True))
    assert progress_mode(UcxOptions(), {}) == ("blocking", "config transport.options.progress_mode")
    with pytest.raises(ValueError, match="UCXPY_PROGRESS_MODE"):
        progress_mode(UcxOptions(), {"UCXPY_PROGRESS_MODE": "thread-polling"})


def test_ucx_transport_registers_and_validates_without_importing_ucxx() -> None:
    code = (
        "import sys\n"
        "from kvcr_policy import load_config\n"
        "c = load_config(overrides={'transport.name': 'ucx', 'transport.options.peer': 'h:1',"
        " 'transport.options.tls': 'tcp'})\n"
        "assert c.config.transport.options['tls'] == 'tcp'\n"
        "assert 'ucxx' not in sys.modules, 'ucxx was imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_unknown_ucx_options_are_config_errors(clean_env: None) -> None:
    from kvcr_policy import load_config
    from kvcr_policy.errors import ConfigError

    with pytest.raises(ConfigError, match=r"transport\.options"):
        load_config(overrides={"transport.name": "ucx", "transport.options.tsl": "sm"})
