"""ACME's own tests, written with hpc_train's fixtures for plugin authors (see ../conftest.py)."""

from __future__ import annotations

import acme_hpc.plugin
import pytest


@pytest.fixture
def plugins(hpc_train_plugins):
    return hpc_train_plugins(("acme", acme_hpc.plugin))


def test_script_matches_the_reviewed_one(plugins, hpc_train_render, hpc_train_golden):
    hpc_train_golden(hpc_train_render(plugins, "acme", "--lr", "1e-4", nodes=2), "acme-torchrun.sh")


def test_override_and_site_env_are_in_the_script(plugins, hpc_train_render):
    text = hpc_train_render(plugins, "acme", nodes=2)
    assert "source /etc/acme/fabric.sh" in text and "questions to hpc@acme.example" in text
    assert "export UCX_NET_DEVICES=mlx5_0:1  # plugins" in text
    assert "module load cuda/12.4" in text


def test_every_violation_is_reported_at_once(plugins, hpc_train_policy):
    problems = hpc_train_policy(plugins, "acme", nodes=4, time="72:00:00")
    assert len(problems) == 2, problems
    assert "need a reservation" in problems[0] and "allows 48:00:00 at most" in problems[1]
    assert hpc_train_policy(plugins, "acme", nodes=4, reservation="big-run", time="24:00:00") == []


def test_default_account_per_partition_unless_the_user_chose_one(plugins, hpc_train_plan):
    assert ("account", "acme-debug") in hpc_train_plan(plugins, "acme", partition="debug").directives
    assert ("account", "mine") in hpc_train_plan(plugins, "acme", account="mine").directives


def test_other_sites_are_untouched(plugins, hpc_train_render):
    text = hpc_train_render(plugins, "sandbox", nodes=2)
    assert "acme" not in text.lower() and "UCX_NET_DEVICES" not in text


def test_login_nodes_are_detected(plugins):
    assert plugins.detect_site(hostname="login2.acme.example", environ={}) == "acme"
    assert plugins.detect_site(hostname="laptop", environ={}) == "local"
