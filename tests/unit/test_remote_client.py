"""The laptop's side of --remote without a network: which words reach the login node's shell, which files
rsync is told to send, what ssh's own failures become, the user's remote settings and their errors, and the
key a retried submission reuses."""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.errors import ConfigError, UsageError
from hpc_train.remote import client, settings
from hpc_train.remote.ssh import Ssh, explain, hpc_train_line, remote_line
from hpc_train.remote.upload import includes
from hpc_train.snapshot.files import Entry
from tests.conftest import write


def test_words_reach_the_login_nodes_shell_quoted_and_home_expanded_there():
    line = remote_line("~/venv/bin/python", "-m", "hpc_train", "status", "1; rm -rf ~", "$(id)")
    assert line == """"$HOME"/venv/bin/python -m hpc_train status '1; rm -rf ~' '$(id)'"""
    out = subprocess.run(["sh", "-c", f"printf '%s\\n' {remote_line('a b', '~/x y', '`id`')}"], capture_output=True, text=True)
    assert out.stdout.splitlines()[0:1] == ["a b"] and out.stdout.splitlines()[2] == "`id`"
    assert hpc_train_line("python3", "logs", "7") == "PYTHONSAFEPATH=1 HPC_TRAIN_NO_REMOTE=1 python3 -m hpc_train logs 7"


@pytest.mark.parametrize("host", ["-oProxyCommand=touch /tmp/x", "a b", "host\nx", ""])
def test_a_host_ssh_would_read_as_an_option_is_refused(host):
    with pytest.raises(UsageError):
        Ssh(host)


def test_rsync_is_told_every_file_and_the_folders_above_it_and_nothing_else():
    patterns = includes(["train.py", "pkg/sub/m[1].py", "pkg/__init__.py"]).split(b"\0")[:-1]
    assert patterns == [b"/pkg/", b"/pkg/sub/", b"/train.py", b"/pkg/sub/m\\[1\\].py", b"/pkg/__init__.py"]


@pytest.mark.parametrize(
    "stderr, fragment, retry",
    [
        ("ssh: Could not resolve hostname x: Name or service not known", "cannot find the host", False),
        ("root@127.0.0.1: Permission denied (publickey).", "refused the authentication", False),
        ("@@@ WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED! @@@\nHost key verification failed.", "other than the one", False),
        ("No ED25519 host key is known for [127.0.0.1]:2222 and you have requested strict checking.", "not known here", False),
        ("ssh: connect to host 127.0.0.1 port 2222: Connection refused", "ssh to h failed", True),
        ("client_loop: send disconnect: Broken pipe", "ssh to h failed", True),
    ],
)
def test_what_ssh_says_becomes_what_to_do(stderr, fragment, retry):
    error = explain("h", stderr)
    assert fragment in error.message and error.hint and error.retryable is retry and error.exit_code == 69


def test_the_users_remote_settings_and_their_errors(isolated_user):
    assert settings.load() == settings.RemoteSettings()  # no file: the defaults
    path = write(settings.config_path(), "remote:\n  host: login1\n  python: ~/v/bin/python\n")
    assert settings.load().host == "login1" and settings.load().python == "~/v/bin/python"
    write(path, "remote:\n  hots: login1\n")
    with pytest.raises(ConfigError) as err:
        settings.load()
    assert "config.yaml:2: remote.hots: unknown key" in str(err.value) and "did you mean 'host'" in str(err.value)
    write(path, "remotes:\n  host: x\n")
    with pytest.raises(ConfigError):
        settings.load()


def test_argv_for_the_login_node_loses_only_the_remote_flag():
    assert client.without_remote(["status", "7", "--remote", "l", "--json"]) == ["status", "7", "--json"]
    assert client.without_remote(["logs", "--remote=l", "7"]) == ["logs", "7"]


def test_a_submission_asked_again_before_its_answer_came_reuses_its_key(isolated_user):
    entries = [Entry("train.py", 10, stamp=(10, 1, 1, 1))]
    request = {"script": "train.py", "options": {"nodes": 2}}
    pending = client._pending("login", request, entries)
    first = client._key(pending)
    assert client._key(client._pending("login", request, entries)) == first  # dropped: asked again, same key
    other = client._key(client._pending("login", {**request, "options": {"nodes": 3}}, entries))
    assert other != first  # another submission
    pending.unlink()  # answered: the next identical submit is a new job
    assert client._key(client._pending("login", request, entries)) != first


def test_a_login_node_with_another_hpc_train_is_refused_naming_both_versions():
    from hpc_train.errors import RemoteError
    from hpc_train.version import __version__

    ssh, config = Ssh("login1"), settings.RemoteSettings()
    answered = subprocess.run(["sh", "-c", "echo 'hpc_train 0.0.9'"], capture_output=True, text=True)  # what --version prints
    with pytest.raises(RemoteError) as err:
        client.check_version(ssh, config, answered, "~/up/p")
    assert f"login1 has hpc_train 0.0.9, this machine {__version__}" in err.value.message and __version__ in err.value.hint
    same = subprocess.run(["sh", "-c", f"echo 'hpc_train {__version__}'"], capture_output=True, text=True)
    client.check_version(ssh, config, same, "~/up/p")  # the same version: no error


def test_a_login_node_whose_own_config_names_a_remote_runs_the_forwarded_command_itself(isolated_user, monkeypatch):
    import argparse

    write(settings.config_path(), "remote:\n  host: login1\n")  # the same dotfiles on the laptop and the login node
    args = argparse.Namespace(remote=None)
    assert client.host_of(args) == "login1"  # on the laptop: every remote command goes there
    monkeypatch.setenv("HPC_TRAIN_NO_REMOTE", "1")  # what the forwarded line sets (hpc_train_line)
    assert "HPC_TRAIN_NO_REMOTE=1" in hpc_train_line("python3", "status", "7") and client.host_of(args) is None
    assert client.host_of(argparse.Namespace(remote="login2")) == "login2"  # a flag still says where
