"""``parse_cores``: core lists for pinning servers and trainer ranks on CPU."""

from __future__ import annotations

import os

import pytest

from servers import ServerConfig
from servers.config import parse_cores


def test_core_lists_and_ranges_parse_to_sorted_cores():
    available = sorted(os.sched_getaffinity(0))
    first = available[0]
    assert parse_cores(str(first)) == [first]
    assert parse_cores(f"{first}-{available[-1]}") == list(range(first, available[-1] + 1))
    assert parse_cores(f"{available[-1]},{first}") == sorted({first, available[-1]})


def test_a_core_the_machine_lacks_names_the_key_and_the_available_cores():
    available = sorted(os.sched_getaffinity(0))
    with pytest.raises(ValueError) as info:
        parse_cores("4096", "actor_rollout_ref.actor.cpu_cores")
    assert str(info.value) == (
        "actor_rollout_ref.actor.cpu_cores='4096' names core(s) [4096] this machine does not "
        f"offer; available: {available}"
    )


def test_a_malformed_core_list_says_what_to_write():
    with pytest.raises(ValueError) as info:
        ServerConfig(model="m", cpu_cores="first")
    assert (
        str(info.value) == 'cpu_cores=\'first\' is not a core list: write e.g. "0", "0-3" or "0,2"'
    )


def test_a_single_core_given_as_a_number_on_the_command_line_is_taken():
    """``cpu_cores=0`` reaches the config as the int 0 (Hydra parses it): one core, as "0"."""
    from trainer.config import load_config

    first = min(os.sched_getaffinity(0))
    config, _ = load_config(
        [
            "actor_rollout_ref.model.path=m",
            f"actor_rollout_ref.rollout.cpu_cores={first}",
            f"actor_rollout_ref.actor.cpu_cores={first}",
        ]
    )
    ref = config.actor_rollout_ref
    assert parse_cores(ref.rollout.engine.cpu_cores) == parse_cores(ref.actor.cpu_cores) == [first]
    assert ServerConfig(model="m", cpu_cores=first).cpu_cores == first
