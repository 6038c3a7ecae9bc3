"""Planning: defaults, precedence and every resource check, before anything is rendered."""

from __future__ import annotations

from datetime import timedelta

import pytest

from hpc_train.api import make_job
from hpc_train.config.loader import load_site
from hpc_train.errors import ConfigError, UnknownNameError
from hpc_train.submission.plan import build_plan


def plan(plugins, site="bluecloud", **options):
    options.setdefault("script", "train.py")
    options.setdefault("workdir", "/home/alice/project")
    options.setdefault("python", "/opt/venv/bin/python")
    job = make_job(site=site, **options)
    return build_plan(job, load_site(site), plugins)


def test_gpu_partition_defaults_procs_to_gpus(plugins):
    p = plan(plugins, nodes=4)
    assert (p.partition, p.gpus_per_node, p.procs_per_node, p.tasks_per_node) == ("a100", 8, 8, 1)
    assert ("gres", "gpu:a100:8") in p.directives
    assert p.world_size == 32


def test_cpu_partition_defaults_to_one_process(plugins):
    p = plan(plugins, site="sandbox", nodes=2)
    assert (p.gpus_per_node, p.procs_per_node) == (0, 1)
    assert not any(k == "gres" for k, _ in p.directives)
    assert ("time", "00:10:00") in p.directives  # the partition's default time


def test_procs_per_node_option_wins(plugins):
    assert plan(plugins, site="sandbox", procs_per_node=3).procs_per_node == 3


def test_env_precedence_and_sources(plugins):
    p = plan(plugins, env={"NCCL_IB_HCA": "mlx5_0", "MINE": "1"}, nccl_profile="debug")
    env = {e.name: e for e in p.env}
    assert env["NCCL_IB_HCA"].value == "mlx5_0" and env["NCCL_IB_HCA"].source == "job"
    assert env["NCCL_DEBUG"].source == "nccl profile debug"
    assert env["PYTHONUNBUFFERED"].source == "site"
    # the partition's default profile is replaced by the one asked for
    assert "NCCL_IB_GID_INDEX" not in env


def test_all_resource_problems_reported_together(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, nodes=64, gpus_per_node=16, time="8-00:00:00")
    text = str(info.value)
    assert "3 problems" in text
    assert "allows at most 32 nodes, 64 requested" in text
    assert "has 8 GPUs per node, 16 requested" in text
    assert "8-00:00:00 exceeds partition 'a100''s limit 7-00:00:00" in text


def test_unknown_partition_and_profile_suggest(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, partition="a10", nccl_profile="ib-hdx")
    text = str(info.value)
    assert "no partition 'a10'" in text and "did you mean 'a100'" in text
    assert "no NCCL profile 'ib-hdx'" in text and "'ib-hdr'" in text


def test_unknown_backend_suggests(plugins):
    with pytest.raises(UnknownNameError) as info:
        plan(plugins, backend="torchrunn")
    assert "did you mean 'torchrun'" in info.value.hint


def test_backend_options_are_typed(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, backend_options={"max_restart": 2, "rdzv_backend": "etcd"})
    text = str(info.value)
    assert "max_restart: unknown key" in text and "did you mean 'max_restarts'" in text
    assert "rdzv_backend: expected one of 'c10d' or 'static'" in text


def test_local_site_is_one_node(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="local", nodes=2)
    assert "--nodes 1" in str(info.value)


@pytest.mark.parametrize(
    "options, fragment",
    [
        ({"nodes": 0}, "--nodes: expected a number ≥ 1, got 0"),
        ({"time": "12h"}, "--time: malformed time '12h'"),
        ({"job_name": "x\n#SBATCH --qos=high"}, "--job-name: must not contain newlines"),
        ({"sbatch": {"nodes": "3"}}, "--nodes is set by hpc_train"),
        ({"sbatch": {"mail type": "END"}}, "is not an sbatch long option name"),
        ({"env": {"1BAD": "x"}}, "not a valid environment variable name"),
        ({"hang_timeout": "soon"}, "'soon' is not a duration: give seconds (300), 300s, 5m, 1h, or off"),
        ({"hang_timeout": "-5"}, "is not a duration"),
        ({"straggler_threshold": 11}, "--straggler-threshold"),
    ],
)
def test_bad_job_options(options, fragment):
    with pytest.raises(ConfigError) as info:
        make_job(script="train.py", **options)
    assert fragment in str(info.value)


def test_passthrough_sbatch_and_policy_hooks(plugins):
    from hpc_train import hookimpl

    class Policy:
        @hookimpl
        def hpc_train_sbatch_directives(self, job, site, backend):
            return {"qos": "normal", "comment": "from-plugin"}

        @hookimpl
        def hpc_train_validate_job(self, job, site):
            return ["over 2 nodes needs a reservation"] if job.nodes > 2 and not job.reservation else []

    plugins.pm.register(Policy())
    p = plan(plugins, nodes=2, sbatch={"qos": "high", "mail-type": "END"})
    directives = dict(p.directives)
    assert directives["qos"] == "high"  # the job's own option wins over the hook
    assert directives["comment"] == "from-plugin" and directives["mail-type"] == "END"
    with pytest.raises(ConfigError) as info:
        plan(plugins, nodes=4)
    assert "site policy (bluecloud): over 2 nodes needs a reservation" in str(info.value)


def test_requeue_policy_from_site_and_job(plugins):
    from hpc_train.submission.renderer import render

    p = plan(plugins, site="sandbox", time="00:10:00", checkpoint_every=50, max_restarts=2)
    directives = dict(p.directives)
    assert directives["requeue"] is True and directives["signal"] == "B:USR2@60"
    assert directives["open-mode"] == "append"
    env = {e.name: e.value for e in p.env}
    assert env["HPC_TRAIN_CHECKPOINT_EVERY"] == "50"
    text = render(p, ())
    assert "export HPC_TRAIN_RUN HPC_TRAIN_MAX_RESTARTS=2" in text
    assert "export HPC_TRAIN_DEADLINE=$(( $(date +%s) + 540 ))" in text  # 10 min - 60 s grace
    assert """trap 'touch "${HPC_TRAIN_STOP_FILE}"' USR2\n""" in text
    # TERM too, noted: a requeued run leaves at once when Slurm's TERM has come, not at its SIGKILL
    assert """trap 'touch "${HPC_TRAIN_STOP_FILE}"; hpc_train_termed=1' TERM""" in text
    assert 'wait "${hpc_train_step}"' in text
    off = plan(plugins, site="sandbox", requeue=False)
    assert "requeue" not in dict(off.directives) and "HPC_TRAIN_STOP_FILE" not in render(off, ())
    assert "scontrol requeue" in render(plan(plugins, site="sandbox", on_failure="requeue"), ())


def test_requeue_problems(plugins):
    with pytest.raises(ConfigError, match="only Slurm sites requeue"):
        plan(plugins, site="local", requeue=True)
    with pytest.raises(ConfigError, match="must come after the job starts"):
        plan(plugins, site="sandbox", time="1", signal_grace=120)


@pytest.mark.parametrize("metrics, expected", [(None, None), (False, "0"), (True, "1")])
def test_metrics_switch_reaches_the_job(plugins, metrics, expected):
    p = plan(plugins, site="sandbox", **({} if metrics is None else {"metrics": metrics}))
    env = {e.name: e.value for e in p.env}
    assert env.get("HPC_TRAIN_METRICS") == expected  # unset: the runtime's default (on) applies


def test_hang_watchdog_and_health_settings_reach_the_job(plugins):
    from hpc_train.submission.renderer import render

    learned = plan(plugins, site="sandbox")
    env = {e.name: e.value for e in learned.env}
    assert learned.watchdog and "HPC_TRAIN_HANG_TIMEOUT" not in env  # learned from the run's step time
    assert env["HPC_TRAIN_EXCLUDE_SUSPECTS"] == "1" and env["HPC_TRAIN_STRAGGLER_THRESHOLD"] == "0.2"
    text = render(learned, ())
    assert '-m hpc_train.runtime.supervise.watchdog --step-pid "${hpc_train_step}" &' in text
    assert "-m hpc_train.runtime.supervise.between_runs failed" in text and "ExcNodeList=" in text
    given = plan(plugins, site="sandbox", hang_timeout="5m", straggler_threshold=0.5)
    env = {e.name: e.value for e in given.env}
    assert env["HPC_TRAIN_HANG_TIMEOUT"] == "300" and env["HPC_TRAIN_STRAGGLER_THRESHOLD"] == "0.5"
    for off in (
        plan(plugins, site="sandbox", hang_timeout="off"),
        plan(plugins, site="sandbox", requeue=False),
        plan(plugins, site="local"),
    ):
        assert not off.watchdog and "hpc_train.runtime.supervise.watchdog" not in render(off, ())
        assert "HPC_TRAIN_HANG_TIMEOUT" not in {e.name for e in off.env}


@pytest.mark.parametrize(
    "value, directive",
    [
        ("12:00:00", "12:00:00"),
        ("90", "01:30:00"),  # the CLI's --time 90: sbatch's minutes, as before
        (timedelta(hours=1), "01:00:00"),
        (timedelta(days=2, minutes=30), "2-00:30:00"),
    ],
)
def test_time_takes_slurm_strings_and_timedeltas(plugins, value, directive):
    assert ("time", directive) in plan(plugins, nodes=1, time=value).directives


@pytest.mark.parametrize(
    "value, fragment",
    [
        (3600, "time=3600 is ambiguous (minutes or seconds?): give '01:00:00' or timedelta(hours=1)"),
        (90, "give '00:01:30' or timedelta(seconds=90)"),
        (2.5, "time=2.5 is ambiguous"),
        (timedelta(0), "expected a positive whole number of seconds"),
    ],
)
def test_time_refuses_a_bare_number(value, fragment):
    with pytest.raises(ConfigError) as info:
        make_job(script="train.py", time=value)
    assert fragment in str(info.value)


def test_python_submit_refuses_a_bare_number_before_submitting(tmp_path, monkeypatch):
    import hpc_train

    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    with pytest.raises(ConfigError, match="time=3600 is ambiguous"):
        hpc_train.submit("train.py", site="sandbox", nodes=1, time=3600)


def test_procs_per_node_beyond_the_gpus_names_both_numbers_and_the_right_value(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, procs_per_node=16)
    [problem] = info.value.problems
    assert problem.key == "--procs-per-node"
    assert "16 processes per node, but partition 'a100' has 8 GPUs per node" in problem.message
    assert problem.hint.startswith("use --procs-per-node 8")
    with pytest.raises(ConfigError, match="the job has 4 GPUs per node") as info:
        plan(plugins, gpus_per_node=4, procs_per_node=8)
    assert "use --procs-per-node 4" in str(info.value)
    assert plan(plugins, procs_per_node=4).procs_per_node == 4  # fewer processes than GPUs: the job's choice
    assert plan(plugins, site="sandbox", procs_per_node=3).procs_per_node == 3  # a CPU partition has no such rule


def test_mem_and_cpus_beyond_the_partitions_nodes(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, mem="2T", cpus_per_task=200)
    problems = {p.key: p for p in info.value.problems}
    assert problems["--mem"].message == "2T per node, but partition 'a100' has 1000G per node"
    assert problems["--mem"].hint.startswith("use --mem 1000G or less")
    assert (
        "200 CPUs x 1 task(s) per node = 200, but partition 'a100' has 128 CPUs per node" in problems["--cpus-per-task"].message
    )
    assert problems["--cpus-per-task"].hint == "use --cpus-per-task 128 or fewer"
    with pytest.raises(ConfigError, match="20 CPUs x 8 task") as info:  # mpi: one task per process
        plan(plugins, backend="mpi", cpus_per_task=20)
    assert "use --cpus-per-task 16 or fewer" in str(info.value)
    fits = plan(plugins, backend="mpi", cpus_per_task=16, mem="1000000")  # megabytes: under 1000G
    assert ("cpus-per-task", 16) in fits.directives and ("mem", "1000000") in fits.directives
    assert plan(plugins, site="sandbox", mem="999T").job.mem == "999T"  # no memory figure in the site: no check


@pytest.mark.parametrize(
    "value, fragment",
    [
        ("lots", "'lots' is not a memory size: a number of megabytes (64000), or one with a unit K, M, G or T (500G)"),
        ("5 GB", "did you mean '5G'?"),
        ("1.5G", "'1.5G' is not a memory size"),
    ],
)
def test_an_unparsable_mem_names_the_accepted_forms(plugins, value, fragment):
    from hpc_train.config.job import JobSpec

    with pytest.raises(ConfigError) as info:
        make_job(script="train.py", mem=value)
    assert "--mem" in str(info.value) and fragment in str(info.value)
    # a JobSpec made directly (hpc_train.sweep takes one) gets the same check from the plan
    job = JobSpec(site="bluecloud", script="train.py", workdir="/home/alice/project", mem=value)
    with pytest.raises(ConfigError) as info:
        build_plan(job, load_site("bluecloud"), plugins)
    assert info.value.problems[0].key == "--mem" and fragment in str(info.value)


@pytest.mark.parametrize(
    "sbatch, shown, hint",
    [
        ({"mail-tipe": "END"}, "<job>: --sbatch mail-tipe=END: sbatch has no option --mail-tipe", "did you mean --mail-type?"),
        ({"exclusiv": True}, "<job>: --sbatch exclusiv: sbatch has no option --exclusiv", "did you mean --exclusive?"),
        ({"zzzz": "1"}, "<job>: --sbatch zzzz=1: sbatch has no option --zzzz", "`man sbatch` lists its options"),
    ],
)
def test_an_unknown_sbatch_option_suggests_the_closest(plugins, sbatch, shown, hint):
    with pytest.raises(ConfigError) as info:
        plan(plugins, sbatch=sbatch)
    assert str(info.value).startswith(shown) and info.value.problems[0].hint == hint


def test_known_sbatch_options_pass(plugins):
    p = plan(plugins, sbatch={"mail-type": "END", "exclusive": True, "tres-per-task": "cpu:2", "mem-per-gpu": "40G"})
    assert {"mail-type", "exclusive", "tres-per-task", "mem-per-gpu"} <= dict(p.directives).keys()


def test_user_in_site_paths_falls_back_to_the_account_name(plugins, monkeypatch):
    import getpass

    monkeypatch.delenv("USER", raising=False)
    monkeypatch.setattr(getpass, "getuser", lambda: "alice")
    env = {e.name: e.value for e in plan(plugins).env}
    assert env["HPC_TRAIN_CHECKPOINTS_DIR"] == "/shared/checkpoints/alice"  # bluecloud: /shared/checkpoints/$USER
    monkeypatch.delenv("USER_DIR", raising=False)
    p = plan(plugins, job_root="/scratch/${USER}/$USER_DIR")
    assert p.job_root == "/scratch/alice/$USER_DIR"  # another variable, unset: left as it is


def test_user_unknown_names_the_site_file_key(plugins, monkeypatch):
    import getpass

    def no_user() -> str:
        raise KeyError("getpwuid(): uid not found: 4242")

    monkeypatch.setenv("USER", "")
    monkeypatch.setattr(getpass, "getuser", no_user)
    with pytest.raises(ConfigError) as info:
        plan(plugins)
    [problem] = info.value.problems
    assert problem.source.endswith("bluecloud.yaml") and problem.key == "storage.checkpoints" and problem.line == 13
    assert "'/shared/checkpoints/$USER' uses $USER, but USER is not set" in problem.message
    assert "export USER=$(id -un)" in problem.hint
    with pytest.raises(ConfigError, match="--job-root"):
        plan(plugins, site="sandbox", job_root="/scratch/$USER")
    assert plan(plugins, site="sandbox").job_root == "/tmp/hpc_train-sandbox/jobs"  # no $USER: no user needed


def test_the_node_check_runs_where_a_failing_node_can_be_replaced(plugins):
    from hpc_train.errors import ConfigError
    from hpc_train.testing import plan_job

    assert plan_job(plugins, "sandbox", node_check=True).node_check
    # its suspects are avoided by the requeue even with the watchdog off
    quiet = plan_job(plugins, "sandbox", node_check=True, hang_timeout="off")
    assert not quiet.watchdog and {e.name: e.value for e in quiet.env}["HPC_TRAIN_EXCLUDE_SUSPECTS"] == "1"
    assert not plan_job(plugins, "sandbox").node_check  # opt-in: the site's health.node_check is off
    with pytest.raises(ConfigError) as caught:
        plan_job(plugins, "sandbox", node_check=True, requeue=False)
    assert "--node-check" in str(caught.value) and "requeue" in str(caught.value)


def _srun(p) -> list[str]:
    from hpc_train.submission.renderer import context

    return [str(w) for w in context(p)["srun"]]


@pytest.mark.parametrize(
    ("options", "per_task", "per_proc"),
    [
        ({}, 128, 16),  # torchrun: one task per node holds the node's CPUs, its 8 workers share them
        ({"backend": "mpi"}, 16, 16),  # one task per GPU: the node's CPUs split between them
        ({"gpus_per_node": 2, "procs_per_node": 2}, 32, 16),  # a quarter of the GPUs: a quarter of the CPUs
        ({"backend": "mpi", "gpus_per_node": 4, "procs_per_node": 4}, 16, 16),
        ({"cpus_per_task": 40}, 40, 5),  # the user's request, per Slurm task
    ],
)
def test_each_task_asks_slurm_and_srun_for_the_cpus_its_processes_use(plugins, options, per_task, per_proc):
    p = plan(plugins, **options)
    assert p.cpus_per_task == per_task and ("cpus-per-task", per_task) in p.directives
    assert f"--cpus-per-task={per_task}" in _srun(p)  # 22.05's srun does not inherit it from sbatch
    threads = {e.name: e.value for e in p.env}["OMP_NUM_THREADS"]
    assert threads == str(per_proc)


def test_a_partition_without_cpu_figures_asks_for_nothing(plugins):
    p = plan(plugins, site="sandbox", nodes=2, procs_per_node=2)
    assert p.cpus_per_task is None and not any(k == "cpus-per-task" for k, _ in p.directives)
    assert not any(w.startswith("--cpus-per-task") for w in _srun(p))


def test_gpu_binding_where_the_partition_asks_for_it(plugins):
    mpi = plan(plugins, backend="mpi")  # one task per GPU: srun binds each to its GPU and the cores near it
    assert {"--cpu-bind=cores", "--gpu-bind=closest"} <= set(_srun(mpi))
    torchrun = plan(plugins)  # one task per node: srun binds the task; torchrun binds its workers
    assert "--cpu-bind=cores" in _srun(torchrun) and "--gpu-bind=closest" not in _srun(torchrun)
    assert "--numa-binding=exclusive" in [str(w) for w in torchrun.launch]
    rtx = plan(plugins, partition="rtx4090", backend="mpi")  # a partition that does not ask
    assert not any(w.startswith(("--cpu-bind", "--gpu-bind")) for w in _srun(rtx))
    assert "--numa-binding=exclusive" not in [str(w) for w in plan(plugins, partition="rtx4090").launch]


def test_binding_keys_are_checked_like_every_other(tmp_path):
    from hpc_train.errors import ConfigError as Error

    site = tmp_path / "s.yaml"
    site.write_text("description: x\nscheduler: slurm\npartitions:\n  p:\n    cpu_bind: core\n")
    with pytest.raises(Error) as info:
        load_site(str(site))
    assert "cpu_bind" in str(info.value) and "cores" in str(info.value)


def test_every_problem_names_the_option_as_the_cli_spells_it(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="sandbox", nodes=9, spare_nodes=3, container=True, backend_options={"max_restarts": "x"})
    keys = {p.key for p in info.value.problems}
    assert {"--nodes", "--spare-nodes", "--container"} <= keys, keys
    assert not any("_" in k.split(" ")[0] for k in keys if k.startswith("-")), keys  # never a field's name
    with pytest.raises(ConfigError) as info:
        make_job(site="sandbox", script="t.py", backend_options=[1])
    assert [p.key for p in info.value.problems] == ["--option"]  # the flag, not --backend-options


def local_tier_site(tmp_path, value: str):
    site = tmp_path / "s.yaml"
    site.write_text(f"name: s\nextends: sandbox\ncheckpoint_local_dir: {value}\n")
    return site


def test_the_sites_node_local_folder_reaches_the_job_unexpanded_and_quoted(plugins, tmp_path):
    from hpc_train.submission.renderer import render

    site = local_tier_site(tmp_path, "'$SLURM_TMPDIR/ckpt'")
    job = make_job(site=str(site), script="train.py", workdir="/home/alice/project", python="/opt/venv/bin/python")
    p = build_plan(job, load_site(str(site)), plugins)
    env = {e.name: e.value for e in p.env}
    assert env["HPC_TRAIN_LOCAL_CHECKPOINT_DIR"] == "$SLURM_TMPDIR/ckpt"  # each node expands its own
    assert "export HPC_TRAIN_LOCAL_CHECKPOINT_DIR='$SLURM_TMPDIR/ckpt'" in render(p)
    off = make_job(site=str(site), script="train.py", workdir="/w", python="/p", local_checkpoints=False)
    assert "HPC_TRAIN_LOCAL_CHECKPOINT_DIR" not in {e.name for e in build_plan(off, load_site(str(site)), plugins).env}
    assert "HPC_TRAIN_LOCAL_CHECKPOINT_DIR" not in {e.name for e in plan(plugins, site="sandbox").env}


def test_local_checkpoints_on_a_site_without_a_node_local_folder_is_refused(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="sandbox", local_checkpoints=True)
    [problem] = info.value.problems
    assert "names no node-local storage" in problem.message and "checkpoint_local_dir" in problem.hint
    assert "--local-checkpoints" in str(info.value)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("local/ckpt", "is not an absolute path"), ('"/local/x\\nrm -rf /"', "must not contain newlines")],
)
def test_a_node_local_folder_that_is_no_absolute_path_is_refused_at_its_line(tmp_path, value, fragment):
    with pytest.raises(ConfigError) as info:
        load_site(str(local_tier_site(tmp_path, value)))
    [problem] = info.value.problems
    assert problem.key == "checkpoint_local_dir" and problem.line == 3 and fragment in problem.message


@pytest.mark.parametrize(
    "site, options, why, hint",
    [
        ("local", {}, "site 'local' runs the job on this machine, where nothing restarts a hung run", "submit to a Slurm site"),
        ("sandbox", {"requeue": False}, "with requeue off, a hung run could not be restarted", "drop --no-requeue"),
    ],
)
def test_a_hang_timeout_where_no_watchdog_runs_is_refused_with_where_it_does(plugins, site, options, why, hint):
    """Issue 31: `--site local --hang-timeout 20s` was accepted and a hung rank sat until killed from outside."""
    with pytest.raises(ConfigError) as info:
        plan(plugins, site=site, hang_timeout="20s", **options)
    message = str(info.value)
    assert "--hang-timeout: the hang watchdog does not run here" in message and why in message and hint in message, message
    plan(plugins, site=site, hang_timeout="off", **options)  # turning it off is always fine
    assert {e.name: e.value for e in plan(plugins, site="sandbox", hang_timeout="20s").env}["HPC_TRAIN_HANG_TIMEOUT"] == "20"


def _step_retry(text: str) -> str:
    """The line after the step that says whether a failed run is retried (restarted on a spare, or requeued)."""
    return next(line for line in text.splitlines() if line.startswith("hpc_train_retry="))


@pytest.mark.parametrize("options", [{}, {"hang_timeout": "off"}, {"on_failure": "requeue"}])
def test_spare_nodes_restart_a_run_that_crashed_on_a_node(plugins, options):
    """Issue 31: `--spare-nodes 1` alone left a crashed run's job FAILED, the spare unused (only hangs were retried)."""
    from hpc_train.submission.renderer import render

    p = plan(plugins, site="sandbox", nodes=2, spare_nodes=1, **options)
    assert p.on_failure == "requeue" and ("nodes", 3) in p.directives
    text = render(p, ())
    assert _step_retry(text) == "hpc_train_retry=1", text  # a crash is retried: on a spare, else by a requeue
    assert "restarting inside the allocation" in text
    # without spares the site's policy stays (sandbox: a crash fails the job)
    assert plan(plugins, site="sandbox", nodes=2).on_failure == "fail"
    assert _step_retry(render(plan(plugins, site="sandbox", nodes=2), ())) == "hpc_train_retry=0"


def test_spare_nodes_with_on_failure_fail_is_refused_naming_the_pair(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="sandbox", nodes=2, spare_nodes=1, on_failure="fail")
    [problem] = info.value.problems
    assert problem.key == "--spare-nodes"
    assert "--spare-nodes: needs --on-failure requeue (given: --on-failure fail)" in str(info.value)
    assert "with the spares unused" in problem.message and "drop --spare-nodes" in problem.hint


@pytest.mark.parametrize("option", [{"on_failure": "requeue"}, {"max_restarts": 2}, {"signal_grace": 60}])
@pytest.mark.parametrize(
    "site, extra, why, hint",
    [
        ("local", {}, "site 'local' runs the job on this machine; only Slurm sites requeue", "submit to a Slurm site"),
        ("sandbox", {"requeue": False}, "requeue is off (--no-requeue)", "drop --no-requeue"),
        ("generic-slurm", {}, "site 'generic-slurm' has requeue off (requeue.enabled)", "add --requeue"),
    ],
)
def test_requeue_options_where_nothing_requeues_are_refused_with_what_would(plugins, option, site, extra, why, hint):
    """Issue 31: `--on-failure requeue` on a site with requeue off rendered no retry at all, silently."""
    with pytest.raises(ConfigError) as info:
        plan(plugins, site=site, **option, **extra)
    [problem] = info.value.problems
    flag = "--" + next(iter(option)).replace("_", "-")
    assert problem.key == flag and problem.message == f"acts through the requeue: {why}", problem
    assert problem.hint == f"{hint}, or leave {flag} out"
    plan(plugins, site="sandbox", **option)  # where the job requeues, each is honoured
    plan(plugins, site=site, max_restarts=0, on_failure="fail", **extra)  # what no requeue does anyway


@pytest.mark.parametrize(
    "option, value",
    [("account", "a"), ("qos", "q"), ("reservation", "r"), ("constraint", "c"), ("mem", "4G"), ("after", "12")],
)
def test_sbatch_options_on_the_local_site_are_refused_not_dropped(plugins, option, value):
    flag = "--" + option.replace("_", "-")
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="local", **{option: value})
    [problem] = info.value.problems
    assert problem.key == flag and "site 'local' runs the job on this machine, without sbatch" in problem.message
    assert f"leave {flag} out" in problem.hint
    directives = dict(plan(plugins, site="sandbox", **{option: value}).directives)
    assert {"after": "dependency"}.get(option, option) in directives


def test_an_after_type_without_after_is_refused(plugins):
    with pytest.raises(ConfigError) as info:
        plan(plugins, site="sandbox", after_type="afterany")
    assert "--after-type: afterany says how the --after jobs must end, and none is given" in str(info.value)
    assert dict(plan(plugins, site="sandbox", after="7", after_type="afterany").directives)["dependency"] == "afterany:7"


def test_every_rule_is_a_check_of_the_plans_facts_that_says_what_it_guards():
    import inspect

    from hpc_train.submission.plan_checks import CHECKS

    assert len(CHECKS) == len({c.__name__ for c in CHECKS}) >= 14
    for check in CHECKS:
        assert list(inspect.signature(check).parameters) == ["f"], check.__name__
        assert check.__doc__ and check.__name__.startswith("check_"), check.__name__
