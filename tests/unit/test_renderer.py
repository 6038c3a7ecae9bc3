"""Rendering: byte-identical golden scripts, shell safety proven by bash, site template overrides."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from hpc_train.api import make_job
from hpc_train.config.loader import load_site
from hpc_train.errors import ConfigError, TemplateError
from hpc_train.submission.plan import build_plan
from hpc_train.submission.renderer import render
from hpc_train.submission.shell import quote, sbatch_line
from hpc_train.testing import assert_golden
from tests.conftest import write

GOLDEN = Path(__file__).resolve().parent.parent / "golden"
BACKENDS = ["torchrun", "deepspeed", "horovod", "mpi"]
SITES = {
    "local": {"procs_per_node": 2},
    "sandbox": {"nodes": 2},
    "generic-slurm": {"nodes": 2, "procs_per_node": 4},
    "bluecloud": {"nodes": 4, "time": "12:00:00"},
}


@pytest.fixture
def alice(monkeypatch):
    monkeypatch.setenv("HOME", "/home/alice")
    monkeypatch.setenv("USER", "alice")


def render_job(plugins, site, backend="torchrun", **options):
    job = make_job(
        site=site,
        backend=backend,
        script="train.py",
        script_args=["--lr", "1e-4"],
        workdir="/home/alice/project",
        python="/opt/venv/bin/python",
        **options,
    )
    return render(build_plan(job, load_site(site), plugins), plugins.template_dirs())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("site", sorted(SITES))
def test_golden_scripts(plugins, alice, site, backend):
    text = render_job(plugins, site, backend, **SITES[site])
    assert_golden(text, GOLDEN / f"{site}-{backend}.sh")  # the mechanism plugin authors get (hpc_train.testing)


def test_rendering_is_deterministic(plugins, alice):
    assert render_job(plugins, "bluecloud", nodes=2) == render_job(plugins, "bluecloud", nodes=2)


def test_rendered_script_is_valid_bash(plugins, alice, tmp_path):
    for site, options in SITES.items():
        script = write(tmp_path / f"{site}.sh", render_job(plugins, site, **options))
        result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr


NASTY = [
    "it's",
    'say "hi"',
    "$(touch PWNED)",
    "`touch PWNED`",
    "a;touch PWNED",
    "x\ntouch PWNED",
    "\n#SBATCH --qos=high",
    "$HOME",
    "--flag=$((1+1))",
    "back\\slash",
    "tab\there",
    "\x7f",
    "",
]


@pytest.mark.parametrize("value", NASTY)
def test_quoted_words_come_back_unchanged_through_bash(value, tmp_path):
    result = subprocess.run(["bash", "-c", f"printf '%s' {quote(value)}"], capture_output=True, cwd=tmp_path)
    assert result.stdout.decode() == value
    assert "\n" not in quote(value)
    assert not (tmp_path / "PWNED").exists()


def test_script_arguments_and_env_are_inert_in_a_real_run(plugins, alice, tmp_path):
    """Run the rendered local script's launch line through bash with a stand-in python that prints argv."""
    fake = write(tmp_path / "python", '#!/bin/sh\nfor a in "$@"; do printf \'<%s>\' "$a"; done\n')
    fake.chmod(0o755)
    args = ["$(touch PWNED)", "x\n#SBATCH --qos=high", "`id`", "it's"]
    job = make_job(
        site="local",
        script="train.py",
        script_args=args,
        workdir=str(tmp_path),
        python=str(fake),
        env={"EVIL": "$(touch PWNED2)"},
        job_name="n'; touch PWNED3; '",
    )
    text = render(build_plan(job, load_site("local"), plugins), ())
    assert "\n#SBATCH --qos" not in text
    script = write(tmp_path / "job.sh", text)
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    for arg in args:
        assert f"<{arg}>" in out.stdout
    assert not any((tmp_path / name).exists() for name in ("PWNED", "PWNED2", "PWNED3"))


def test_sbatch_lines_refuse_control_characters():
    assert sbatch_line("job-name", "a b") == "#SBATCH --job-name='a b'"
    assert sbatch_line("exclusive", True) == "#SBATCH --exclusive"
    with pytest.raises(ValueError):
        sbatch_line("comment", "a\n#SBATCH --qos=high")


def test_site_overrides_one_block(plugins, alice, site_dir):
    write(
        site_dir / "templates" / "mine.sh.j2",
        '{% extends "default:sbatch/base.sh.j2" %}\n{% block setup %}\n# MY SITE SETUP\nsource /etc/site.sh\n{% endblock %}\n',
    )
    write(site_dir / "mine.yaml", "extends: generic-slurm\ntemplate: mine.sh.j2\ntemplate_dirs: [templates]\n")
    text = render_job(plugins, "mine")
    assert "# MY SITE SETUP\nsource /etc/site.sh" in text
    assert "#SBATCH --nodes=1" in text and "torch.distributed.run" in text  # the rest is the built-in


def test_template_syntax_error_names_file_and_line(plugins, alice, site_dir):
    write(
        site_dir / "templates" / "broken.sh.j2",
        '{% extends "default:sbatch/base.sh.j2" %}\n\n{% block setup %}\n{% if %}\n{% endblock %}\n',
    )
    write(site_dir / "mine.yaml", "template: broken.sh.j2\ntemplate_dirs: [templates]\n")
    with pytest.raises(TemplateError) as info:
        render_job(plugins, "mine")
    text = str(info.value)
    assert "broken.sh.j2:4: template syntax error" in text


def test_undefined_template_variable_is_an_error(plugins, alice, site_dir):
    write(site_dir / "templates" / "typo.sh.j2", "#!/bin/bash\n#SBATCH --partition={{ plan.partiton }}\n")
    write(site_dir / "mine.yaml", "template: typo.sh.j2\ntemplate_dirs: [templates]\n")
    with pytest.raises(TemplateError) as info:
        render_job(plugins, "mine")
    assert "partiton" in str(info.value)


def test_missing_template_says_where_it_looked(plugins, alice, site_dir):
    write(site_dir / "mine.yaml", "template: nope.sh.j2\n")
    with pytest.raises(TemplateError) as info:
        render_job(plugins, "mine")
    assert "template 'nope.sh.j2' not found" in str(info.value)


def test_container_wraps_each_task(plugins, alice, site_dir):
    write(
        site_dir / "box.yaml",
        "extends: generic-slurm\ncontainer:\n  runtime: apptainer\n  enabled: true\n  image: /img/pt.sif\n  mounts: [/data:/data]\n",
    )
    assert "apptainer" not in render_job(plugins, "box", container=False)
    text = render_job(plugins, "box")
    assert "\\\n    apptainer exec --bind /data:/data /img/pt.sif \\\n    /opt/venv/bin/python -m torch.distributed.run" in text
    write(
        site_dir / "pyx.yaml", "extends: generic-slurm\ncontainer:\n  runtime: pyxis\n  image: nvcr.io#nvidia/pytorch:24.05-py3\n"
    )
    assert "container-image" not in render_job(plugins, "pyx")  # opt-in site: not unless asked
    assert "'--container-image=nvcr.io#nvidia/pytorch:24.05-py3'" in render_job(plugins, "pyx", container=True)


def test_bluecloud_ngc_container_is_opt_in(plugins, alice):
    assert "apptainer" not in render_job(plugins, "bluecloud")
    text = render_job(plugins, "bluecloud", container=True)
    assert (
        "apptainer exec --nv --bind /shared/datasets:/datasets --bind /shared/checkpoints:/checkpoints /shared/containers/nvcr-pytorch-24.05.sif"
        in text
    )
    with pytest.raises(ConfigError, match="has no container runtime"):
        render_job(plugins, "sandbox", container_image="x.sif")


def test_nsys_profiling_renders_the_same_launch_and_tells_the_ranks_which_nsys_and_script(plugins, alice):
    # the chosen ranks' python is put under nsys by the job's sitecustomize, the same under every backend:
    # the script differs only by the variables that say so (hpc_train.runtime.boot.hpc_train_nsys)
    for backend in BACKENDS:
        plain = render_job(plugins, "sandbox", backend, nodes=2, partition="gpu").splitlines()
        text = render_job(plugins, "sandbox", backend, nodes=2, partition="gpu", profile="nsys:active=2,ranks=0,last")
        if backend == "torchrun":
            assert_golden(text, GOLDEN / "sandbox-torchrun-nsys.sh")
        assert [line for line in text.splitlines() if line not in plain] == [
            "export HPC_TRAIN_NSYS=nsys  # hpc_train",
            "export HPC_TRAIN_PROFILE=nsys:wait=5,warmup=2,active=2,ranks=0,last  # job",
            "export HPC_TRAIN_PROFILE_SCRIPT=/home/alice/project/train.py  # hpc_train",
        ], backend
