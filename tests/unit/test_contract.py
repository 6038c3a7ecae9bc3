"""The job folder's names have one home: the template writes what the login side and the runtime read."""

from __future__ import annotations

import re

from hpc_train import contract
from hpc_train.testing import render_job
from tests.conftest import REPO

WRITTEN_BY_THE_SCRIPT = ("RUNS", "LAST_RUN", "CHECKPOINTS", "STOP_REQUESTED", "REQUEUE_REQUESTED", "NO_RETRY")


def test_the_template_spells_no_job_folder_name_itself():
    template = (REPO / "templates" / "sbatch" / "base.sh.j2").read_text()
    for key in WRITTEN_BY_THE_SCRIPT:
        assert f"{{{{ files.{key} }}}}" in template
        assert not re.search(rf'JOB_FOLDER}}/{re.escape(getattr(contract, key))}\b', template), key


def test_the_rendered_script_uses_the_contracts_names(plugins):
    text = render_job(plugins, "sandbox", nodes=2)
    for key in WRITTEN_BY_THE_SCRIPT:
        assert f'"${{HPC_TRAIN_JOB_FOLDER}}/{getattr(contract, key)}"' in text, key
    assert vars(contract.FILES) == {k: getattr(contract, k) for k in vars(contract.FILES)}
